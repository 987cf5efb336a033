/* A run config's value for a GStreamer element's property, checked on the real element: the
 * property exists and can be set, and the value converts to its type within its range (enum
 * nicks, numbers, booleans) as gst_parse_launch would convert it. */
#pragma once

#include <gst/gst.h>

#include <string>
#include <vector>

#include "toml_subset.h"

namespace videotrain {

// The text `key=` gets in a pipeline description (arrays become comma lists, for string
// properties only). False with *why, a phrase that follows "'key' in [table]": " is not a
// property of ..." or ": 5 is not a value of ...".
bool property_text(GstElement *element, const std::string &key, const toml::Value &value, std::string *text,
                   std::string *why);

// " (did you mean 'x'?)" when a candidate is near enough to `key` to be a typo of it, else "".
std::string did_you_mean(const std::string &key, const std::vector<std::string> &candidates);

}  // namespace videotrain
