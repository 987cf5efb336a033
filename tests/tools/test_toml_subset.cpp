// videotrain-run's TOML reader (tools/toml_subset.h): what it takes, as TOML 1.0 reads it, and
// what it refuses, each with the line.
#include <gtest/gtest.h>

#include "toml_subset.h"

namespace toml = videotrain::toml;
using Kind = toml::Value::Kind;

namespace {

toml::Document ok(const std::string &text) {
  toml::Document d;
  std::string err;
  EXPECT_TRUE(toml::parse(text, &d, &err)) << err;
  return d;
}

std::string error_of(const std::string &text) {
  toml::Document d;
  std::string err;
  EXPECT_FALSE(toml::parse(text, &d, &err)) << "accepted: " << text;
  return err;
}

}  // namespace

TEST(TomlSubset, TablesArraysOfTablesAndValues) {
  auto d = ok("# a run\n"
              "[run]\n"
              "output = \"runs/a b\"   # comment\n"
              "ranks = 2\n"
              "\n"
              "[[dataset]]\n"
              "manifest = 'C:\\data\\train.csv'\n"
              "repeats = 1_000\n"
              "[[dataset]]\n"
              "folder = \"clips\"\n"
              "[trainer]\n"
              "lr = 1e-4\n"
              "logit-mean = -0.5\n"
              "\"quoted key\" = true\n"
              "buckets = [\n"
              "  \"832x480\",  # landscape\n"
              "  \"480x832\",\n"
              "]\n"
              "range = [875, 1000.0]\n");
  ASSERT_EQ(d.tables.size(), 5u);
  EXPECT_TRUE(d.tables[0].entries.empty());
  const auto &run = d.tables[1];
  EXPECT_EQ(run.name, "run");
  EXPECT_EQ(run.line, 2);
  EXPECT_EQ(run.entries[0].value.str, "runs/a b");
  EXPECT_EQ(run.entries[1].value.kind, Kind::Integer);
  EXPECT_EQ(run.entries[1].value.integer, 2);
  EXPECT_TRUE(d.tables[2].array_item);
  EXPECT_EQ(d.tables[2].entries[0].value.str, "C:\\data\\train.csv");  // literal: no escapes
  EXPECT_EQ(d.tables[2].entries[1].value.integer, 1000);
  EXPECT_EQ(d.tables[3].name, "dataset");
  EXPECT_EQ(d.tables[3].line, 9);
  const auto &t = d.tables[4].entries;
  EXPECT_EQ(t[0].value.kind, Kind::Float);
  EXPECT_DOUBLE_EQ(t[0].value.number, 1e-4);
  EXPECT_EQ(t[0].value.source, "1e-4");
  EXPECT_DOUBLE_EQ(t[1].value.number, -0.5);
  EXPECT_EQ(t[2].key, "quoted key");
  EXPECT_TRUE(t[2].value.boolean);
  ASSERT_EQ(t[3].value.kind, Kind::Array);
  ASSERT_EQ(t[3].value.items.size(), 2u);
  EXPECT_EQ(t[3].value.items[1].str, "480x832");
  EXPECT_EQ(t[3].line, 15);
  EXPECT_EQ(t[4].line, 19);  // lines counted through the multi-line array
  EXPECT_EQ(t[4].value.items[1].kind, Kind::Float);
}

TEST(TomlSubset, BasicStringEscapes) {
  auto d = ok("[a]\ns = \"q\\\"b\\\\n\\tt\\u00e9\\U0001F600\"\n");
  EXPECT_EQ(d.tables[1].entries[0].value.str, "q\"b\\n\tt\xC3\xA9\xF0\x9F\x98\x80");
}

TEST(TomlSubset, RefusalsNameTheLine) {
  EXPECT_EQ(error_of("[a]\nx = 1\nx = 2\n"), "line 3: 'x' is set twice in [a] (first on line 2)");
  EXPECT_EQ(error_of("[a]\n[b]\n[a]\n"), "line 3: table [a] is defined twice");
  EXPECT_EQ(error_of("[a]\nx = 1 2\n"), "line 2: unexpected '2' after the value (one key = value a line)");
  EXPECT_EQ(error_of("[a]\nx = fast\n"), "line 2: 'fast' is not a value (strings are quoted: \"fast\")");
  EXPECT_EQ(error_of("[a]\nx = \"open\n"), "line 2: the string is not closed on its line");
  EXPECT_EQ(error_of("[a]\nx = \"\\q\"\n"),
            "line 2: unknown escape \\q (write \\\\ for a backslash, or use 'single quotes')");
  EXPECT_EQ(error_of("[a]\nx.y = 1\n"), "line 2: dotted key 'x.…': write a [table] header instead (not supported here)");
  EXPECT_EQ(error_of("[a]\nx = { y = 1 }\n"), "line 2: inline tables are not supported here: write a [table] header");
  EXPECT_EQ(error_of("[a]\nx = [1, \"b\"]\n"), "line 2: the array mixes an integer and a string");
  EXPECT_EQ(error_of("[a]\nx = [1,\n2\n"), "line 4: the array is not closed");
  EXPECT_EQ(error_of("[a]\nx = 012\n"), "line 2: '012': leading zeros are not allowed");
  EXPECT_EQ(error_of("[a]\nx = 1__0\n"), "line 2: '1__0': an underscore must sit between digits");
  EXPECT_EQ(error_of("[a]\nx = 1.\n"), "line 2: '1.': a digit must follow the decimal point");
  EXPECT_EQ(error_of("[a]\nx = 99999999999999999999\n"), "line 2: '99999999999999999999' does not fit a 64-bit integer");
  EXPECT_EQ(error_of("[a]\nx = nan\n"), "line 2: 'nan' is not a usable number here");
  EXPECT_EQ(error_of("[a]\nx = \"\"\"long\"\"\"\n"), "line 2: multi-line strings are not supported here");
  EXPECT_EQ(error_of("[a\n"), "line 1: the header is not closed with ]");
  EXPECT_EQ(error_of("[a]\n= 1\n"), "line 2: '=' cannot start a key");
  EXPECT_EQ(error_of("[a]\nx 1\n"), "line 2: expected '=' after the key 'x'");
  EXPECT_EQ(error_of("[a]\nx =\n"), "line 2: a value is missing");
  EXPECT_EQ(error_of("[[a]]\n[a]\n"), "line 2: [a] after [[a]] of the same name");
  EXPECT_EQ(error_of("[a]\nd = 2024-01-01\n"),
            "line 2: '2024-01-01' is not a number (strings are quoted; dates are not supported here)");
  EXPECT_EQ(error_of(std::string("[a]\nx = 1\0", 10)), "the file holds a NUL byte: not a text file");
}

TEST(TomlSubset, CrLfAndByteOrderMark) {
  auto d = ok("\xEF\xBB\xBF[a]\r\nx = 'v'\r\ny = [1,\r\n 2]\r\n");
  ASSERT_EQ(d.tables.size(), 2u);
  EXPECT_EQ(d.tables[1].entries[1].line, 3);
  EXPECT_EQ(d.tables[1].entries[1].value.items.size(), 2u);
}
