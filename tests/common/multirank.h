/* Multi-process tests: the test binary starts itself once per rank (fork + exec) to
 * run one worker test, e.g. DdpWorker.Rank. Worker tests (suite names ending in
 * "Worker") are entry points for those processes: the shared main() filters them out
 * unless VIDEOTRAIN_TEST_WORKER is set, which spawn_rank() does. */
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace vttest {

// A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT).
int free_port();

// Runs this binary as rank `rank` of `world` with only `worker_test` selected, with
// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=port and `env` set.
pid_t spawn_rank(const std::string &worker_test, int rank, int world, int port,
                 const std::vector<std::pair<std::string, std::string>> &env);

// Waits for every pid; their wait statuses go to *status. Past `limit_s` it kills the
// rest and returns false: a hang fails the test instead of blocking it.
bool wait_all(std::vector<pid_t> pids, std::vector<int> *status, double limit_s);

}  // namespace vttest
