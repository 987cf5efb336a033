// The plugin loads and documents every element and property (what gst-inspect-1.0 shows).
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace {
const char *kElements[] = {"csvvideosrc", "vaeencoder", "vaedecoder", "textencoder", "imageencoder", "microbatcher",
                           "ddptrainsink", "ddpvalsink", "promptsrc",  "ddpsampler",  "samplesink"};
}

TEST(Plugin, LoadsFromTheBuildTreeWithEveryElement) {
  GstPlugin *plugin = gst_registry_find_plugin(gst_registry_get(), "videotrain");
  ASSERT_NE(plugin, nullptr) << "libgstvideotrain not found in GST_PLUGIN_PATH="
                             << vttest::env_or("GST_PLUGIN_PATH", "");
  EXPECT_STREQ(gst_plugin_get_name(plugin), "videotrain");
  gst_object_unref(plugin);
  for (const char *name : kElements) {
    GstElementFactory *f = gst_element_factory_find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_STRNE(gst_element_factory_get_metadata(f, GST_ELEMENT_METADATA_DESCRIPTION), "") << name;
    EXPECT_NE(gst_element_factory_get_metadata(f, GST_ELEMENT_METADATA_KLASS), nullptr) << name;
    gst_object_unref(f);
  }
}

TEST(Plugin, EveryPropertyIsDocumented) {
  for (const char *name : kElements) {
    GstElement *e = gst_element_factory_make(name, nullptr);
    ASSERT_NE(e, nullptr) << name;
    guint n = 0;
    GParamSpec **specs = g_object_class_list_properties(G_OBJECT_GET_CLASS(e), &n);
    int own = 0;
    for (guint i = 0; i < n; i++) {
      if (specs[i]->owner_type != G_OBJECT_TYPE(e)) continue;  // inherited (name, parent, ...)
      own++;
      const char *blurb = g_param_spec_get_blurb(specs[i]);
      const char *nick = g_param_spec_get_nick(specs[i]);
      EXPECT_TRUE(blurb && std::string(blurb).size() > 10) << name << "::" << specs[i]->name << " has no blurb";
      EXPECT_TRUE(nick && *nick) << name << "::" << specs[i]->name;
      EXPECT_TRUE(specs[i]->flags & G_PARAM_STATIC_STRINGS) << name << "::" << specs[i]->name;
    }
    EXPECT_GT(own, 0) << name;
    g_free(specs);
    gst_object_unref(e);
  }
}

TEST(Plugin, GstInspectListsTheElements) {
  std::string plugin = vttest::env_or("VIDEOTRAIN_BUILD_DIR", ".") + "/plugins/videotrain/libgstvideotrain.so";
  std::string cmd = "gst-inspect-1.0 " + plugin + " 2>&1";
  FILE *f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, f)) out.append(buf, k);
  EXPECT_EQ(pclose(f), 0) << out;
  for (const char *name : kElements) EXPECT_NE(out.find(name), std::string::npos) << name << " missing:\n" << out;
}

TEST(Plugin, TheDocsNameHowManyElementsGstInspectLists) {
  // Troubleshooting tells users what `gst-inspect-1.0 videotrain` should list.
  const std::string page =
      vttest::read_file(vttest::env_or("VIDEOTRAIN_SOURCE_DIR", ".") + "/docs/troubleshooting.md");
  const char *counts[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                          "twelve"};
  const size_t n = sizeof kElements / sizeof kElements[0];
  ASSERT_LT(n, 13u);
  EXPECT_NE(page.find("should list " + std::string(counts[n]) + " elements"), std::string::npos)
      << "docs/troubleshooting.md does not say gst-inspect-1.0 lists " << counts[n] << " elements";
}
