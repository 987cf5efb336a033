#include "dist_env.h"

#include <cerrno>
#include <cstdlib>

namespace videotrain {

std::optional<long> env_int(const char *name) {
  const char *v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  errno = 0;
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') return std::nullopt;
  return x;
}

namespace {

struct Launcher {
  const char *name, *rank, *world, *local_rank, *local_world;
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv e;
  for (const auto &l : kLaunchers) {
    auto r = env_int(l.rank), w = env_int(l.world);
    if (!r || !w || *w < 1 || *r < 0 || *r >= *w) continue;
    e.rank = static_cast<int>(*r);
    e.world_size = static_cast<int>(*w);
    e.local_rank = static_cast<int>(env_int(l.local_rank).value_or(*r));
    e.local_world_size = static_cast<int>(env_int(l.local_world).value_or(*w));
    e.source = l.name;
    break;
  }
  if (const char *a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  if (auto p = env_int("MASTER_PORT"); p && *p > 0 && *p < 65536) e.master_port = static_cast<int>(*p);
  return e;
}

bool is_loopback(const std::string &addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

StoreScope store_scope_from_environment() {
  StoreScope s;
  const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  s.agent_store = agent && std::string(agent) == "True";
  if (s.agent_store) s.prefix = "attempt_" + std::to_string(env_int("TORCHELASTIC_RESTART_COUNT").value_or(0)) + "/";
  return s;
}

}  // namespace videotrain
