/* c10d pieces that the trainer's and the validation's process groups share (torch TUs).
 *
 * TCPStore: LibTorch 2.4+ defaults to the libuv server, which builds without libuv
 * (Debian's libtorch, some source builds) refuse with an exception; there we fall back
 * to the classic server, as PyTorch's Python does with USE_LIBUV=0. USE_LIBUV=0 in the
 * environment chooses the classic server everywhere.
 *
 * Gloo device: GLOO_SOCKET_IFNAME when set, the loopback when the master is local (the
 * hostname may resolve to an address that is not up in containers), else the default. */
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "first_line.h"

namespace videotrain {

inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string &host, c10d::TCPStoreOptions so) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const char *env = std::getenv("USE_LIBUV");
  if (env && std::string(env) == "0") so.useLibUV = false;
  if (so.useLibUV) {
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, so);
    } catch (const std::exception &e) {
      if (std::string(e.what()).find("libuv") == std::string::npos) throw;
      so.useLibUV = false;
    }
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, so);
}

inline std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string &master_addr) {
  const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

/* Roll call before a process group is built. Every rank sets `join/<rank>` to its world
 * size and waits, until `deadline`, for the other ranks' keys. Without it a missing rank
 * shows up only as Gloo's "Socket Timeout" after twice the timeout, and different world
 * sizes as Gloo's "[enforce fail at address.cc] ... 136 vs 272". Throws
 * std::runtime_error naming the ranks that never joined or the world sizes seen. */
inline void await_ranks(c10d::Store &store, int rank, int world, std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds timeout) {
  auto key = [](int r) { return "join/" + std::to_string(r); };
  auto read_int = [&](int r) {
    auto v = store.get(key(r));
    return std::atoi(std::string(v.begin(), v.end()).c_str());
  };
  const std::string me = "rank " + std::to_string(rank) + " of " + std::to_string(world);
  std::vector<int> sizes(static_cast<size_t>(world), -1);  // -1: not joined yet
  sizes[static_cast<size_t>(rank)] = world;
  std::string differ;
  auto note = [&](int r, int w) {
    differ += (differ.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " has " + std::to_string(w);
  };
  try {
    const std::string mine = std::to_string(world);
    store.set(key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (;;) {
      bool all = true;
      for (int r = 0; r < world; r++) {
        if (sizes[static_cast<size_t>(r)] >= 0) continue;
        if (!store.check({key(r)})) {
          all = false;
          continue;
        }
        sizes[static_cast<size_t>(r)] = read_int(r);
        if (sizes[static_cast<size_t>(r)] != world) note(r, sizes[static_cast<size_t>(r)]);
      }
      // A rank beyond our world has a larger one (it may come too late to be seen).
      if (store.check({key(world)})) note(world, read_int(world));
      if (!differ.empty())
        throw std::runtime_error("the ranks disagree on the world size: " + me + " has " + mine + ", " + differ +
                                 " (set the same world-size or WORLD_SIZE on every rank)");
      if (all) return;
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception &e) {  // c10::Error is no runtime_error
    if (!differ.empty()) throw;
    throw std::runtime_error(me + " lost the c10d store while waiting for the other ranks to join: " + first_line(e.what()));
  }
  std::string missing;
  for (int r = 0; r < world; r++)
    if (sizes[static_cast<size_t>(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  throw std::runtime_error((missing.find(',') == std::string::npos ? "rank " : "ranks ") + missing +
                           " never joined: " + me + " waited " +
                           (timeout.count() % 1000 ? std::to_string(timeout.count()) + " ms"
                                                   : std::to_string(timeout.count() / 1000) + " s") +
                           " for them (start every rank, with the same MASTER_ADDR:MASTER_PORT)");
}

}  // namespace videotrain
