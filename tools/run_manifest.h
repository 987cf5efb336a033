/* The rows of videotrain-run --config's merged manifest (OUTPUT/train.csv): a CSV csvvideosrc
 * reads, with path (absolute), text, and the size columns num_frames, height, width, fps
 * (empty where unknown: csvvideosrc probes those rows at start). */
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "csvvideosrc/manifest.h"

namespace videotrain {

inline constexpr char kRunManifestHeader[] = "path,text,num_frames,height,width,fps\n";

// A folder's videos (searched recursively, in path order), each with the text of its
// same-named .txt (ends trimmed). False with *why naming the first video without one, or
// saying that the folder holds none.
bool folder_videos(const std::string &dir, std::vector<std::pair<std::string, std::string>> *videos,
                   std::string *why);

// A folder video's row.
std::string folder_row(const std::string &path, const std::string &caption);

// A manifest's rows, read as csvvideosrc reads them (columns, root, split); rows it would refuse
// (no path, bad UTF-8) are left out with a note each (up to `max_notes`, then counted in
// *left_out). False with *why when the manifest cannot be opened.
bool manifest_rows(const ManifestOptions &options, std::vector<std::string> *rows, std::vector<std::string> *notes,
                   size_t *left_out, std::string *why);

}  // namespace videotrain
