/* A plain main for a fuzz target: runs LLVMFuzzerTestOneInput over every file of the
 * folders (or files) given, so that the corpus is a regression test without libFuzzer. */
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool run_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fprintf(stderr, "%s (%zu bytes)\n", path.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());  // a failure aborts
  return true;
}

int main(int argc, char **argv) {
  size_t runs = 0;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    struct stat st;
    if (stat(arg.c_str(), &st) != 0) {
      fprintf(stderr, "%s does not exist\n", arg.c_str());
      return 1;
    }
    std::vector<std::string> files;
    if (S_ISDIR(st.st_mode)) {
      DIR *d = opendir(arg.c_str());
      while (dirent *e = d ? readdir(d) : nullptr)
        if (e->d_name[0] != '.') files.push_back(arg + "/" + e->d_name);
      if (d) closedir(d);
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(arg);
    }
    for (const auto &f : files) {
      if (!run_file(f)) return 1;
      runs++;
    }
  }
  printf("%zu inputs ran clean\n", runs);
  return runs ? 0 : 1;
}
