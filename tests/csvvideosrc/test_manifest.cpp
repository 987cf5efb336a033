#include <gtest/gtest.h>

#include <thread>

#include "csvvideosrc/manifest.h"
#include "test_util.h"

using namespace videotrain;

namespace {

class ManifestTest : public ::testing::Test {
 protected:
  std::unique_ptr<Manifest> open_csv(const std::string &content, ManifestOptions o = {}) {
    vttest::write_file(dir.file("m.csv"), content);
    o.location = dir.file("m.csv");
    std::string err;
    auto m = Manifest::open(o, &err);
    EXPECT_NE(m, nullptr) << err;
    return m;
  }
  std::string open_error(const std::string &content, ManifestOptions o = {}) {
    vttest::write_file(dir.file("e.csv"), content);
    if (o.location.empty()) o.location = dir.file("e.csv");
    std::string err;
    EXPECT_EQ(Manifest::open(o, &err), nullptr);
    return err;
  }
  vttest::TempDir dir;
};

}  // namespace

TEST(CsvRecord, QuotesCommasNewlinesAndDoubledQuotes) {
  std::string t = "a,\"b, c\",\"say \"\"hi\"\"\",\"two\nlines\",\r\nnext";
  size_t end = 0;
  auto f = parse_csv_record(t, 0, &end);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0], "a");
  EXPECT_EQ(f[1], "b, c");
  EXPECT_EQ(f[2], "say \"hi\"");
  EXPECT_EQ(f[3], "two\nlines");
  EXPECT_EQ(f[4], "");
  EXPECT_EQ(t.substr(end), "next");
}

TEST_F(ManifestTest, OpenSoraColumnsWithQuotedCaptionsAndCrlf) {
  auto m = open_csv(
      "path,text,num_frames,height,width,aspect_ratio,resolution,fps\r\n"
      "a.mp4,\"A dog, running\",49,480,720,0.67,480p,24\r\n"
      "/abs/b.mp4,\"line one\nline \"\"two\"\"\",49,480,720,0.67,480p,24\r\n");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 2u);
  auto r0 = m->row(0), r1 = m->row(1);
  EXPECT_EQ(r0.error, "");
  EXPECT_EQ(r0.path, dir.file("a.mp4"));
  EXPECT_EQ(r0.caption, "A dog, running");
  EXPECT_EQ(r1.path, "/abs/b.mp4");
  EXPECT_EQ(r1.caption, "line one\nline \"two\"");
  EXPECT_EQ(r1.row, 1u);
}

TEST_F(ManifestTest, BomBlankLinesAndNoTrailingNewline) {
  auto m = open_csv("\xEF\xBB\xBFvideo,caption\n\nx.mp4,first\n\n\ny.mp4,last");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(0).caption, "first");
  EXPECT_EQ(m->row(1).caption, "last");
  EXPECT_EQ(m->row(1).row, 1u);
}

TEST_F(ManifestTest, ColumnDetectionOrderAndOverrides) {
  auto m = open_csv("Prompt,FILE,video_path\nhello,f.mp4,v.mp4\n");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row(0).path, dir.file("v.mp4")) << "video_path comes before file";
  EXPECT_EQ(m->row(0).caption, "hello");
  ManifestOptions o;
  o.path_column = "file";
  o.caption_column = "video_path";
  m = open_csv("Prompt,FILE,video_path\nhello,f.mp4,v.mp4\n", o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row(0).path, dir.file("f.mp4"));
  EXPECT_EQ(m->row(0).caption, "v.mp4");
  auto none = open_csv("path\nonly.mp4\n");
  EXPECT_EQ(none->row(0).caption, "");
}

TEST_F(ManifestTest, RootOverridesTheManifestFolder) {
  ManifestOptions o;
  o.root = "/data/videos";
  auto m = open_csv("path\nsub/a.mp4\n", o);
  EXPECT_EQ(m->row(0).path, "/data/videos/sub/a.mp4");
}

TEST_F(ManifestTest, SplitKeepsMatchingRowsWithTheirRowNumbers) {
  ManifestOptions o;
  o.split = "val";
  auto m = open_csv("path,text,split\na,x,train\nb,\"y, \"\"q\"\"\",val\nc,z,train\nd,w, val \n", o);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(0).row, 1u);
  EXPECT_EQ(m->row(0).caption, "y, \"q\"");
  EXPECT_EQ(m->row(0).split, "val");
  EXPECT_EQ(m->row(1).row, 3u);
  EXPECT_NE(open_error("path\na\n", o).find("split"), std::string::npos);
}

TEST_F(ManifestTest, BadRowsAreReportedNotFatal) {
  auto m = open_csv("path,text\n,empty path\nok.mp4,\"bad \xC3\x28 utf8\"\nlonely\n");
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ(m->row(0).error, "empty path");
  EXPECT_NE(m->row(1).error.find("UTF-8"), std::string::npos);
  EXPECT_EQ(m->row(2).error, "");  // a missing caption field is just an empty caption
  auto short_row = open_csv("text,path\nonly caption\n");
  EXPECT_NE(short_row->row(0).error.find("fields"), std::string::npos);
}

TEST_F(ManifestTest, ErrorsNameTheFileAndProblem) {
  ManifestOptions o;
  o.location = dir.file("absent.csv");
  std::string err = open_error("", o);
  EXPECT_NE(err.find("absent.csv"), std::string::npos) << err;
  err = open_error("");
  EXPECT_NE(err.find("empty"), std::string::npos) << err;
  err = open_error("caption,length\nx,1\n");
  EXPECT_NE(err.find("no path column"), std::string::npos) << err;
  EXPECT_NE(err.find("caption, length"), std::string::npos) << "lists the header: " << err;
  ManifestOptions p;
  p.path_column = "clip";
  err = open_error("path\nx\n", p);
  EXPECT_NE(err.find("'clip'"), std::string::npos) << err;
}

TEST_F(ManifestTest, CogVideoFolderLayout) {
  vttest::write_file(dir.file("videos.txt"), "videos/a.mp4\r\nvideos/b.mp4\n\n");
  vttest::write_file(dir.file("prompts.txt"), "first prompt\r\nsecond prompt");
  ManifestOptions o;
  o.location = dir.path();
  std::string err;
  auto m = Manifest::open(o, &err);
  ASSERT_NE(m, nullptr) << err;
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(1).path, dir.file("videos/b.mp4"));
  EXPECT_EQ(m->row(1).caption, "second prompt");
  EXPECT_EQ(m->row(0).caption, "first prompt");
  vttest::write_file(dir.file("prompts.txt"), "only one\n");
  EXPECT_EQ(Manifest::open(o, &err), nullptr);
  EXPECT_NE(err.find("videos.txt has 2 lines but prompts.txt has 1"), std::string::npos) << err;
}

TEST_F(ManifestTest, LargeManifestIsIndexedCompactlyAndReadConcurrently) {
  const size_t n = 100000;
  std::string csv = "path,text\n";
  csv.reserve(n * 40);
  for (size_t i = 0; i < n; i++)
    csv += "v" + std::to_string(i) + ".mp4," + (i % 7 == 0 ? "\"q, " + std::to_string(i) + "\"" : std::to_string(i)) +
           "\n";
  auto m = open_csv(csv);
  ASSERT_EQ(m->size(), n);
  EXPECT_LE(m->index_bytes(), 16 * n);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < n; i += 997) {
        auto r = m->row(i);
        std::string want = i % 7 == 0 ? "q, " + std::to_string(i) : std::to_string(i);
        if (r.caption != want || r.path != dir.file("v" + std::to_string(i) + ".mp4")) bad++;
      }
    });
  for (auto &th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}
