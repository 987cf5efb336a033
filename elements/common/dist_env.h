/* Rank and world size from the launcher's environment (no torch, no GObject).
 * Order: torchrun (RANK/WORLD_SIZE/LOCAL_RANK), SLURM, OpenMPI, else 0/1. */
#pragma once

#include <optional>
#include <string>

namespace videotrain {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "default";  // which launcher's variables were used
};

// Reads an integer variable; nullopt when unset, empty or not a whole number.
std::optional<long> env_int(const char *name);

// localhost, 127.x.y.z or ::1 (Gloo then binds to 127.0.0.1 rather than the hostname's address).
bool is_loopback(const std::string &addr);

// Looks at the environment now (call at start-up, not in hot paths).
DistEnv dist_env_from_environment();

// torchrun's elastic agent serves the c10d store itself (TORCHELASTIC_USE_AGENT_STORE=True)
// and keeps it when it restarts the workers: then no rank serves it, and every key goes
// under the attempt (TORCHELASTIC_RESTART_COUNT) so that a restarted group never reads
// the addresses and flags of the one before.
struct StoreScope {
  bool agent_store = false;
  std::string prefix;  // "" or "attempt_N/", put before every key prefix
};
StoreScope store_scope_from_environment();

}  // namespace videotrain
