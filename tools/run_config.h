/* videotrain-run --config run.toml: one TOML file per run (datasets, model folders, the
 * elements' properties by name, the launch) turned into the pipeline the docs show (docs/run-config.md).
 * Every key is checked before anything starts: unknown tables and keys, properties the
 * element does not have, values it would refuse, files that are not there are errors
 * naming the file's line. Needs gst_init (properties are looked up on real elements). */
#pragma once

#include <string>
#include <vector>

namespace videotrain {

struct RunPlan {
  std::string pipeline;   // on one line, for gst_parse_launch
  std::string text;       // the same an element a line, with a header: output/pipeline.txt
  std::string output;     // the run's folder: checkpoint-dir, manifests, pipeline.txt
  int ranks = 1;          // local ranks (videotrain-launch -n) when > 1
  std::string devices;    // CUDA_VISIBLE_DEVICES for the ranks; "" = as it is
  struct File {
    std::string path, text;
  };
  std::vector<File> files;          // written into output by write_run_files (manifests)
  std::vector<std::string> notes;   // what was decided, for the log (rows merged, rows skipped)
};

// Reads and checks `config_path`; false with *error "FILE:LINE: ..." (or "FILE: ...").
// Sets CUDA_VISIBLE_DEVICES when [run] devices is given, before any element is made.
bool build_run_plan(const std::string &config_path, RunPlan *plan, std::string *error);

// Creates output and writes the manifests, pipeline.txt and a copy of the config
// (config.toml), each under a temporary name then renamed.
bool write_run_files(const RunPlan &plan, const std::string &config_path, std::string *error);

}  // namespace videotrain
