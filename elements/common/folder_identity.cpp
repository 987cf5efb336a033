#include "folder_identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "latent_store.h"

namespace videotrain {

bool folder_identity(const std::string &dir, std::string *out, std::string *error) {
  namespace fs = std::filesystem;
  std::string id, config_digest;
  if (!sha256_file(dir + "/config.json", &config_digest, error)) return false;
  id = "config " + config_digest;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto &e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const auto &n : names) {
    struct stat st;
    if (stat((dir + "/" + n).c_str(), &st) != 0) continue;
    id += "\n" + n + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
          std::to_string(st.st_mtim.tv_nsec);
  }
  if (ec) {
    *error = "cannot list '" + dir + "': " + ec.message();
    return false;
  }
  *out = sha256_hex(id);
  return true;
}

}  // namespace videotrain
