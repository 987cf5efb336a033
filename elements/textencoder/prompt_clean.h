/* The prompt cleaning some families' diffusers pipelines apply before tokenizing (ModelFamily::
 * cleans_prompts in models/model_family.h; the text is pipeline_wan.prompt_clean's):
 * HTML entities unescaped twice (html.unescape), then every run of Unicode whitespace made one space
 * and the ends stripped (regex \s+ -> " ", strip). No torch. */
#pragma once

#include <string>

namespace videotrain::text {

// html.unescape for numeric references (&#38; &#x26;, with Python's replacements for 0, surrogates and
// out-of-range code points) and the named entities captions meet (&amp; &lt; &gt; &quot; &apos; &nbsp;
// and typographic ones); an unknown name stays as written. Input and output UTF-8.
std::string html_unescape(const std::string &s);
// Runs of Unicode whitespace (Python's str.isspace set) become one space; leading/trailing removed.
std::string whitespace_clean(const std::string &s);
// whitespace_clean(html_unescape(html_unescape(s))): pipeline_wan.prompt_clean.
std::string prompt_clean(const std::string &s);

}  // namespace videotrain::text
