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

#include <cstdlib>
#include <string>

#include "dist_env.h"

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

}  // namespace videotrain
