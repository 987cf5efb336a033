#include <gtest/gtest.h>
#include <glib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <random>
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
  std::unique_ptr<Manifest> open_folder(const std::string &videos, const std::string &prompts, std::string *err,
                                        ManifestOptions o = {}) {
    vttest::write_file(dir.file("videos.txt"), videos);
    vttest::write_file(dir.file("prompts.txt"), prompts);
    o.location = dir.path();
    return Manifest::open(o, err);
  }
  vttest::TempDir dir;
};

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

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
  f = parse_csv_record("x\ry,\"\",z", 0, &end);  // a lone \r is data; "" is an empty field
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "x\ry");
  EXPECT_EQ(f[1], "");
  EXPECT_EQ(f[2], "z");
}

TEST_F(ManifestTest, OpenSoraColumnsWithQuotedCaptionsAndCrlf) {
  auto m = open_csv(
      "path,text,num_frames,height,width,aspect_ratio,resolution,fps\r\n"
      "a.mp4,\"A dog, running\",49,480,720,0.67,480p,24\r\n"
      "/abs/b.mp4,\"line one\r\nline \"\"two\"\"\",49,480,720,0.67,480p,24\r\n"
      "c.mp4,plain caption,49,480,720,0.67,480p,29.97\r\n");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 3u);
  auto r0 = m->row(0), r1 = m->row(1), r2 = m->row(2);
  EXPECT_EQ(r0.error, "");
  EXPECT_EQ(r0.path, dir.file("a.mp4"));
  EXPECT_EQ(r0.caption, "A dog, running");
  EXPECT_EQ(r1.path, "/abs/b.mp4");
  EXPECT_EQ(r1.caption, "line one\r\nline \"two\"") << "line breaks inside quotes are kept";
  EXPECT_EQ(r1.row, 1u);
  EXPECT_EQ(r2.caption, "plain caption") << "the CR of CRLF is not part of the last field";
  EXPECT_EQ(r2.row, 2u);
  EXPECT_EQ(r0.fps, 24.0) << "the fps column is the video's rate";
  EXPECT_EQ(r2.fps, 29.97);
  EXPECT_TRUE(contains(m->description(), "3 rows")) << m->description();
  EXPECT_TRUE(contains(m->description(), "path column 'path'")) << m->description();
}

TEST_F(ManifestTest, BomBlankLinesAndNoTrailingNewline) {
  auto m = open_csv("\xEF\xBB\xBFvideo,caption\n\nx.mp4,first\n\r\n\ny.mp4,last");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(0).path, dir.file("x.mp4")) << "the BOM is not part of the first column name";
  EXPECT_EQ(m->row(0).caption, "first");
  EXPECT_EQ(m->row(1).caption, "last");
  EXPECT_EQ(m->row(1).row, 1u);
  // A blank trailing line (LF or CRLF) is not a row; nor are blank lines before the header.
  m = open_csv("\n\r\npath,text\na.mp4,x\n\r\n");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->size(), 1u);
  EXPECT_EQ(m->row(0).caption, "x");
}

TEST_F(ManifestTest, ColumnDetectionOrderAndOverrides) {
  auto m = open_csv("Prompt,FILE,video_path\nhello,f.mp4,v.mp4\n");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row(0).path, dir.file("v.mp4")) << "video_path comes before file";
  EXPECT_EQ(m->row(0).caption, "hello") << "names match case-insensitively";
  // Priority order, not header order: path beats video, text beats caption.
  m = open_csv("video,caption,Path,TEXT\nv.mp4,c,p.mp4,t\n");
  EXPECT_EQ(m->row(0).path, dir.file("p.mp4"));
  EXPECT_EQ(m->row(0).caption, "t");
  m = open_csv("filename,x\nfn.mp4,1\n");
  EXPECT_EQ(m->row(0).path, dir.file("fn.mp4"));
  ManifestOptions o;
  o.path_column = "file";
  o.caption_column = "video_path";
  m = open_csv("Prompt,FILE,video_path\nhello,f.mp4,v.mp4\n", o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row(0).path, dir.file("f.mp4"));
  EXPECT_EQ(m->row(0).caption, "v.mp4");
  auto none = open_csv("path\nonly.mp4\n");
  EXPECT_EQ(none->row(0).caption, "");
  EXPECT_EQ(none->row(0).error, "");
  EXPECT_TRUE(contains(none->description(), "no caption column")) << none->description();
}

TEST_F(ManifestTest, RelativePathsResolveAgainstTheManifestFolderOrRoot) {
  ManifestOptions o;
  o.root = "/data/videos";
  auto m = open_csv("path\nsub/a.mp4\n/abs/b.mp4\n", o);
  EXPECT_EQ(m->row(0).path, "/data/videos/sub/a.mp4");
  EXPECT_EQ(m->row(1).path, "/abs/b.mp4") << "absolute paths are kept";
  // A relative location: the folder is made absolute against the working directory.
  vttest::write_file(dir.file("rel.csv"), "path\nsub/a.mp4\n");
  gchar *cwd = g_get_current_dir();
  ASSERT_EQ(chdir(dir.path().c_str()), 0);
  gchar *here = g_get_current_dir();
  ManifestOptions r;
  r.location = "rel.csv";
  std::string err;
  auto rel = Manifest::open(r, &err);
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_NE(rel, nullptr) << err;
  EXPECT_EQ(rel->row(0).path, std::string(here) + "/sub/a.mp4");
  g_free(here);
  g_free(cwd);
}

TEST_F(ManifestTest, SplitKeepsMatchingRowsWithTheirRowNumbers) {
  ManifestOptions o;
  o.split = "val";
  auto m = open_csv("path,text,split\na,x,train\nb,\"y, \"\"q\"\"\",val\nc,z,train\nd,w, val \r\ne,v,\"val\"", o);
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ(m->row(0).row, 1u);
  EXPECT_EQ(m->row(0).caption, "y, \"q\"");
  EXPECT_EQ(m->row(0).split, "val");
  EXPECT_EQ(m->row(1).row, 3u);
  EXPECT_EQ(m->row(1).path, dir.file("d"));
  EXPECT_EQ(m->row(2).row, 4u) << "a quoted split value matches too";
  EXPECT_LE(m->index_bytes(), 3u * 12u);
  // No split option: every row, with its split value.
  auto all = open_csv("path,split\na,train\nb,val\n");
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->row(1).split, "val");
  EXPECT_TRUE(contains(open_error("path\na\n", o), "split")) << "split asked for but no split column";
  o.split = "a\"b";  // a doubled quote in the split value
  auto quoted = open_csv("path,split\nx,\"a\"\"b\"\ny,ab\n", o);
  ASSERT_EQ(quoted->size(), 1u);
  EXPECT_EQ(quoted->row(0).split, "a\"b");
}

TEST_F(ManifestTest, BadRowsAreReportedNotFatal) {
  auto m = open_csv("path,text\n,empty path\nok.mp4,\"bad \xC3\x28 utf8\"\nlonely\nbad\xFF.mp4,x\n  ,blank\n");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 5u);
  EXPECT_EQ(m->row(0).error, "empty path");
  EXPECT_EQ(m->row(0).row, 0u);
  EXPECT_TRUE(contains(m->row(1).error, "UTF-8")) << m->row(1).error;
  EXPECT_TRUE(contains(m->row(1).error, "caption")) << m->row(1).error;
  EXPECT_EQ(m->row(2).error, "");  // a missing caption field is just an empty caption
  EXPECT_TRUE(contains(m->row(3).error, "UTF-8")) << m->row(3).error;
  EXPECT_TRUE(contains(m->row(3).error, "path")) << m->row(3).error;
  EXPECT_EQ(m->row(4).error, "empty path");
  EXPECT_EQ(m->row(4).row, 4u);
  auto short_row = open_csv("text,path\nonly caption\nc,ok.mp4\n");
  ASSERT_EQ(short_row->size(), 2u);
  EXPECT_TRUE(contains(short_row->row(0).error, "fields")) << short_row->row(0).error;
  EXPECT_EQ(short_row->row(1).error, "") << "a bad row does not spoil the next";
  EXPECT_TRUE(contains(short_row->row(5).error, "outside")) << "an index past the end is an error, not a crash";
}

TEST_F(ManifestTest, UnclosedQuoteSwallowsTheRestAndIsReported) {
  auto m = open_csv("path,text\na.mp4,fine\nb.mp4,\"never closed\nc.mp4,x\n");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(0).error, "");
  EXPECT_TRUE(contains(m->row(1).error, "malformed CSV: a quote in row 1 never closes")) << m->row(1).error;
  EXPECT_TRUE(contains(m->description(), "quote never closes from row 1")) << m->description();
  // Said once at start, as a malformed CSV naming the row (not as a video that is not found).
  ASSERT_EQ(m->warnings().size(), 1u);
  EXPECT_TRUE(contains(m->warnings()[0], "is a malformed CSV: a quote in row 1 ")) << m->warnings()[0];
  EXPECT_TRUE(contains(open_error("path,\"text\nx,y\n"), "quote")) << "an unclosed quote in the header";
}

TEST_F(ManifestTest, NoCaptionColumnIsWarnedOnce) {
  auto m = open_csv("path,label\na.mp4,cat\nb.mp4,dog\n");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row(0).caption, "");
  ASSERT_EQ(m->warnings().size(), 1u);
  EXPECT_TRUE(contains(m->warnings()[0], "has no caption column")) << m->warnings()[0];
  EXPECT_TRUE(contains(m->warnings()[0], "header has: path, label")) << m->warnings()[0];
  EXPECT_TRUE(open_csv("path,caption\na.mp4,cat\n")->warnings().empty());
}

TEST_F(ManifestTest, ErrorsNameTheFileAndProblem) {
  ManifestOptions o;
  o.location = dir.file("absent.csv");
  std::string err = open_error("", o);
  EXPECT_TRUE(contains(err, dir.file("absent.csv"))) << err;
  EXPECT_TRUE(contains(err, "No such file")) << err;
  err = open_error("");
  EXPECT_TRUE(contains(err, dir.file("e.csv")) && contains(err, "empty")) << err;
  err = open_error("\xEF\xBB\xBF\r\n\n  \n");
  EXPECT_TRUE(contains(err, "empty") && contains(err, "header")) << "only blank lines: no header: " << err;
  err = open_error("caption,length\nx,1\n");
  EXPECT_TRUE(contains(err, "manifest " + dir.file("e.csv") +
                                " has no path column: looked for path, video, video_path, file, filename; "
                                "header has: caption, length"))
      << err;
  ManifestOptions p;
  p.path_column = "clip";
  err = open_error("path\nx\n", p);
  EXPECT_TRUE(contains(err, "'clip'") && contains(err, "header has: path")) << err;
  ManifestOptions c;
  c.caption_column = "words";
  err = open_error("path,text\nx,y\n", c);
  EXPECT_TRUE(contains(err, "'words'")) << err;
  ManifestOptions none;
  EXPECT_EQ(Manifest::open(none, &err), nullptr);
  EXPECT_TRUE(contains(err, "location")) << err;
  ManifestOptions empty_dir;
  empty_dir.location = dir.path();
  EXPECT_EQ(Manifest::open(empty_dir, &err), nullptr);
  EXPECT_TRUE(contains(err, dir.file("videos.txt"))) << "a folder without the CogVideo files: " << err;
}

TEST_F(ManifestTest, CogVideoFolderLayout) {
  std::string err;
  // CogVideo's loader skips blank lines in both files; a BOM is not part of the first path.
  auto m = open_folder("\xEF\xBB\xBFvideos/a.mp4\r\n\nvideos/b.mp4\n\n", "first prompt\r\n  \nsecond prompt", &err);
  ASSERT_NE(m, nullptr) << err;
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ(m->row(0).path, dir.file("videos/a.mp4"));
  EXPECT_EQ(m->row(0).caption, "first prompt");
  EXPECT_EQ(m->row(1).path, dir.file("videos/b.mp4"));
  EXPECT_EQ(m->row(1).caption, "second prompt");
  EXPECT_EQ(m->row(1).row, 1u);
  EXPECT_EQ(m->row(1).error, "");
  EXPECT_LE(m->index_bytes(), 2u * 16u);
  EXPECT_TRUE(contains(m->description(), "CogVideo")) << m->description();

  ManifestOptions o;
  o.root = "/data";
  m = open_folder("v/a.mp4\n", "p\n", &err, o);
  ASSERT_NE(m, nullptr) << err;
  EXPECT_EQ(m->row(0).path, "/data/v/a.mp4");

  EXPECT_EQ(open_folder("a.mp4\nb.mp4\n", "only one\n", &err), nullptr);
  EXPECT_TRUE(contains(err, dir.file("videos.txt") + " has 2 lines but " + dir.file("prompts.txt") + " has 1"))
      << err;
  ManifestOptions s;
  s.split = "val";
  EXPECT_EQ(open_folder("a.mp4\n", "p\n", &err, s), nullptr);
  EXPECT_TRUE(contains(err, "split")) << err;
}

// Records that straddle the indexer's 4 MiB read blocks: the quote state, a doubled
// quote, a CRLF and the split value carry over from one block to the next.
TEST_F(ManifestTest, RecordsAcrossReadBlocks) {
  const size_t block = 4u << 20;
  const std::string header = "path,text,split\n";
  const std::string tricky = "\"t.mp4\",\"a \"\"b\"\"\r\nc, d\",val\r\n";
  for (size_t k = 1; k <= tricky.size() + 1; k++) {
    // Filler so that the tricky record starts k bytes before the block boundary.
    const size_t fill = block - k - header.size();
    const size_t q = fill / 14 - 1;  // 14-byte rows, then one padding row of the rest
    std::string csv = header;
    csv.reserve(block + 64);
    for (size_t i = 0; i < q; i++) csv += "f.mp4,x,train\n";
    csv += "f.mp4," + std::string(fill - 14 * q - 13, 'x') + ",train\n";
    ASSERT_EQ(csv.size(), block - k);
    csv += tricky + "z.mp4,last,val\n";
    SCOPED_TRACE("tricky record starts " + std::to_string(k) + " bytes before the boundary");
    auto m = open_csv(csv);
    ASSERT_EQ(m->size(), q + 3);
    EXPECT_EQ(m->row(q + 1).caption, "a \"b\"\r\nc, d");
    EXPECT_EQ(m->row(q + 2).path, dir.file("z.mp4"));
    ManifestOptions o;
    o.location = dir.file("m.csv");  // the same file, filtered
    o.split = "val";
    std::string err;
    m = Manifest::open(o, &err);
    ASSERT_NE(m, nullptr) << err;
    ASSERT_EQ(m->size(), 2u);
    EXPECT_EQ(m->row(0).row, q + 1);
    EXPECT_EQ(m->row(0).path, dir.file("t.mp4"));
    EXPECT_EQ(m->row(1).caption, "last");
  }
}

TEST_F(ManifestTest, LargeManifestIsIndexedCompactlyAndReadConcurrently) {
  const size_t n = 100000;
  auto caption = [](size_t i) {
    return i % 7 == 0 ? "q, \"" + std::to_string(i) + "\"\nmore" : "c" + std::to_string(i);
  };
  std::string csv = "path,text,num_frames,split\n";
  csv.reserve(n * 48);
  for (size_t i = 0; i < n; i++) {
    std::string c = caption(i);
    if (i % 7 == 0) c = "\"q, \"\"" + std::to_string(i) + "\"\"\nmore\"";
    csv += "v" + std::to_string(i) + ".mp4," + c + ",49," + (i % 10 == 3 ? "val" : "train") + (i % 2 ? "\r\n" : "\n");
  }
  auto m = open_csv(csv);
  ASSERT_EQ(m->size(), n);
  EXPECT_LE(m->index_bytes(), 16 * n);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0}, read{0};
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      std::mt19937 rng(unsigned(t + 1));
      for (int k = 0; k < 5000; k++) {
        size_t i = rng() % n;
        auto r = m->row(i);
        read++;
        if (r.caption != caption(i) || r.path != dir.file("v" + std::to_string(i) + ".mp4") || r.row != i ||
            !r.error.empty())
          bad++;
      }
    });
  for (auto &th : threads) th.join();
  EXPECT_EQ(read.load(), 20000);
  EXPECT_EQ(bad.load(), 0);

  ManifestOptions o;
  o.split = "val";
  m = open_csv(csv, o);
  ASSERT_EQ(m->size(), n / 10);
  EXPECT_LE(m->index_bytes(), 12 * m->size());
  std::mt19937 rng(9);
  for (int k = 0; k < 1000; k++) {
    size_t i = rng() % m->size();
    auto r = m->row(i);
    ASSERT_EQ(r.row, 10 * i + 3);
    ASSERT_EQ(r.caption, caption(10 * i + 3));
    ASSERT_EQ(r.split, "val");
  }
}

// A runaway caption is cut to max_caption_bytes where a character starts (the row says so), and a
// FIFO or device given as the manifest is refused at once instead of blocking the open.
TEST_F(ManifestTest, LongCaptionsAreCutAtACharacterAndNonFilesAreRefused) {
  std::string caption = "ab";
  while (caption.size() < 20000) caption += "\xe2\x82\xac";  // the euro sign, 3 bytes
  ManifestOptions o;
  o.max_caption_bytes = 16384;
  auto m = open_csv("path,text\na.mp4,\"" + caption + "\"\nb.mp4,short\n", o);
  ASSERT_NE(m, nullptr);
  ManifestRow r = m->row(0);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.caption.size(), 16382u);  // 2 + 3n <= 16384: the last whole character
  EXPECT_EQ(r.caption, caption.substr(0, 16382));
  EXPECT_TRUE(g_utf8_validate(r.caption.data(), static_cast<gssize>(r.caption.size()), nullptr));
  EXPECT_NE(r.warning.find("caption of " + std::to_string(caption.size()) + " bytes cut to 16382"), std::string::npos)
      << r.warning;
  EXPECT_EQ(m->row(1).caption, "short");
  EXPECT_EQ(m->row(1).warning, "");

  ASSERT_EQ(::mkfifo(dir.file("fifo.csv").c_str(), 0644), 0);
  ManifestOptions f;
  f.location = dir.file("fifo.csv");
  EXPECT_NE(open_error("", f).find("not a regular file (a FIFO)"), std::string::npos);
  ::symlink("/dev/zero", dir.file("zero.csv").c_str());
  f.location = dir.file("zero.csv");
  EXPECT_NE(open_error("", f).find("not a regular file (a character device)"), std::string::npos);
}
