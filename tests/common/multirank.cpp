#include "multirank.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace vttest {

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
  int port = ntohs(a.sin_port);
  close(s);
  return port;
}

pid_t spawn_rank(const std::string &worker_test, int rank, int world, int port,
                 const std::vector<std::pair<std::string, std::string>> &env) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  for (const auto &[k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  setenv("VIDEOTRAIN_TEST_WORKER", "1", 1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  const std::string filter = "--gtest_filter=" + worker_test;
  execl("/proc/self/exe", "test-worker", filter.c_str(), static_cast<char *>(nullptr));
  _exit(127);
}

bool wait_all(std::vector<pid_t> pids, std::vector<int> *status, double limit_s) {
  auto t0 = std::chrono::steady_clock::now();
  status->assign(pids.size(), -1);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); i++) {
      if (pids[i] <= 0) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        (*status)[i] = st;
        pids[i] = -1;
        left--;
      }
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      for (size_t i = 0; i < pids.size(); i++)
        if (pids[i] > 0) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], &(*status)[i], 0);
        }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace vttest
