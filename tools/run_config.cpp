#include "run_config.h"

#include <gst/gst.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "element_property.h"
#include "run_manifest.h"
#include "toml_subset.h"

namespace videotrain {
namespace {

namespace fs = std::filesystem;
using toml::Entry;
using toml::Table;
using toml::Value;

// An error already carrying "FILE:LINE: " travels up as this.
struct ConfigError {
  std::string message;
};

// One element of the pipeline: its factory and properties in the order they are printed.
struct Stage {
  std::string factory;
  std::vector<std::pair<std::string, std::string>> props;
  void set(const std::string &k, const std::string &v) {
    for (auto &p : props)
      if (p.first == k) {
        p.second = v;
        return;
      }
    props.emplace_back(k, v);
  }
  const std::string *get(const std::string &k) const {
    for (auto &p : props)
      if (p.first == k) return &p.second;
    return nullptr;
  }
};

// A value as gst_parse_launch reads it: quoted unless it is made of safe characters.
std::string quoted(const std::string &v) {
  bool safe = !v.empty();
  for (char c : v)
    if (!(isalnum(static_cast<unsigned char>(c)) || std::string("_./:+-@%").find(c) != std::string::npos)) safe = false;
  if (safe) return v;
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string render(const Stage &s) {
  std::string out = s.factory;
  for (const auto &p : s.props) out += " " + p.first + "=" + quoted(p.second);
  return out;
}

class Builder {
 public:
  explicit Builder(std::string path) : path_(std::move(path)) {}
  ~Builder() {
    for (auto &e : elements_) gst_object_unref(e.second);
  }
  bool build(RunPlan *plan, std::string *error);

 private:
  [[noreturn]] void fail(int line, const std::string &what) const {
    throw ConfigError{path_ + (line > 0 ? ":" + std::to_string(line) : "") + ": " + what};
  }
  std::string where(const Table &t) const {
    return t.array_item ? "[[" + t.name + "]] of line " + std::to_string(t.line) : "[" + t.name + "]";
  }
  GstElement *element(const std::string &factory);
  std::string property_value(const std::string &factory, const Table &t, const Entry &e);
  std::string path_of(const Entry &e, bool must_exist, bool dir_only = false);
  void apply(const Table *t, const std::string &factory, Stage *stage, const std::set<std::string> &own_keys,
             const std::map<std::string, std::string> &reserved);
  std::string manifest_for(const std::vector<const Table *> &datasets, const std::string &name, RunPlan *plan);
  const Table *single(const std::string &name) const {
    for (const auto &t : doc_.tables)
      if (t.name == name) return &t;
    return nullptr;
  }
  static const Entry *find(const Table *t, const std::string &key) {
    if (!t) return nullptr;
    for (const auto &e : t->entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  std::string string_of(const Table *t, const std::string &key) {
    const Entry *e = find(t, key);
    if (!e) return "";
    if (e->value.kind != Value::Kind::String) fail(e->line, "'" + key + "' in " + where(*t) + " is a string (quote it)");
    return e->value.str;
  }

  std::string path_;
  fs::path base_;  // relative paths in the config are relative to its folder
  toml::Document doc_;
  std::map<std::string, GstElement *> elements_;
};

GstElement *Builder::element(const std::string &factory) {
  auto it = elements_.find(factory);
  if (it != elements_.end()) return it->second;
  GstElement *e = gst_element_factory_make(factory.c_str(), nullptr);
  if (!e) {
    const char *p = g_getenv("GST_PLUGIN_PATH");
    fail(0, "cannot make element '" + factory + "' to check its properties (is GST_PLUGIN_PATH set? it is " +
                (p ? p : "unset") + ")");
  }
  gst_object_ref_sink(e);
  elements_[factory] = e;
  return e;
}

// The text a property gets, checked against the element's own property (element_property.h).
std::string Builder::property_value(const std::string &factory, const Table &t, const Entry &e) {
  std::string text, why;
  if (!property_text(element(factory), e.key, e.value, &text, &why)) fail(e.line, "'" + e.key + "' in " + where(t) + why);
  return text;
}

// A path from the config: relative to the config's folder.
std::string Builder::path_of(const Entry &e, bool must_exist, bool dir_only) {
  if (e.value.kind != Value::Kind::String) fail(e.line, "'" + e.key + "' is a path: quote it");
  if (e.value.str.empty()) fail(e.line, "'" + e.key + "' is empty");
  fs::path p = e.value.str;
  if (p.is_relative()) p = base_ / p;
  p = p.lexically_normal();
  if (must_exist) {
    std::error_code ec;
    auto st = fs::status(p, ec);
    if (!fs::exists(st)) fail(e.line, "'" + e.key + "': " + p.string() + " does not exist");
    if (dir_only && !fs::is_directory(st)) fail(e.line, "'" + e.key + "': " + p.string() + " is not a folder");
  }
  return p.string();
}

// The table's keys onto the stage: own_keys are the builder's own (skipped here), reserved ones
// are set by the builder from another table (named in the map's value).
void Builder::apply(const Table *t, const std::string &factory, Stage *stage, const std::set<std::string> &own_keys,
                    const std::map<std::string, std::string> &reserved) {
  if (!t) return;
  for (const auto &e : t->entries) {
    if (own_keys.count(e.key)) continue;
    auto r = reserved.find(e.key);
    if (r != reserved.end()) fail(e.line, "'" + e.key + "' in " + where(*t) + " is set by the config itself: " + r->second);
    stage->set(e.key, property_value(factory, *t, e));
  }
}

// The manifest csvvideosrc reads for these datasets: one CSV given as it is (one dataset,
// repeats 1, nothing to resolve), else `name` in the output folder with every row of every
// dataset `repeats` times, paths made absolute, the size columns kept (empty ones are probed
// by csvvideosrc at start).
std::string Builder::manifest_for(const std::vector<const Table *> &datasets, const std::string &name, RunPlan *plan) {
  struct Source {
    const Table *t;
    std::string location;  // CSV or CogVideo folder, for Manifest
    std::vector<std::pair<std::string, std::string>> videos;  // a folder of videos + .txt captions
    int64_t repeats = 1;
  };
  std::vector<Source> sources;
  bool plain = datasets.size() == 1;
  for (const Table *t : datasets) {
    Source s{t, {}, {}, 1};
    const Entry *m = find(t, "manifest"), *f = find(t, "folder");
    if (!m && !f) fail(t->line, where(*t) + " names no data: give manifest = \"train.csv\" or folder = \"videos/\"");
    if (m && f) fail(f->line, where(*t) + " gives both manifest and folder: one of them");
    if (const Entry *r = find(t, "repeats")) {
      if (r->value.kind != Value::Kind::Integer || r->value.integer < 1 || r->value.integer > 100000)
        fail(r->line, "'repeats' in " + where(*t) + " is an integer from 1 to 100000");
      s.repeats = r->value.integer;
      if (s.repeats != 1) plain = false;
    }
    for (const char *k : {"root", "path-column", "caption-column", "split"})
      if (find(t, k)) plain = false;
    if (m) {
      s.location = path_of(*m, true);
      if (fs::is_directory(s.location)) plain = false;
    } else {
      std::string dir = path_of(*f, true, true);
      plain = false;
      if (fs::exists(fs::path(dir) / "videos.txt")) {
        s.location = dir;  // CogVideo's layout: videos.txt + prompts.txt
      } else {
        std::string why;
        if (!folder_videos(dir, &s.videos, &why)) fail(f->line, "'folder': " + why);
      }
    }
    sources.push_back(s);
  }
  if (plain) return sources[0].location;

  std::string out = kRunManifestHeader;
  size_t rows = 0, skipped = 0;
  for (const auto &s : sources) {
    std::vector<std::string> lines;
    if (!s.location.empty()) {
      ManifestOptions o;
      o.location = s.location;
      o.sizes = true;
      if (const Entry *r = find(s.t, "root")) o.root = path_of(*r, true, true);
      o.path_column = string_of(s.t, "path-column");
      o.caption_column = string_of(s.t, "caption-column");
      o.split = string_of(s.t, "split");
      std::string why;
      const Entry *at = find(s.t, "manifest") ? find(s.t, "manifest") : find(s.t, "folder");
      if (!manifest_rows(o, &lines, &plan->notes, &skipped, &why)) fail(at->line, "'" + at->key + "': " + why);
    } else {
      for (const auto &v : s.videos) lines.push_back(folder_row(v.first, v.second));
    }
    for (int64_t k = 0; k < s.repeats; k++)
      for (const auto &l : lines) out += l;
    rows += lines.size() * s.repeats;
    plan->notes.push_back(name + ": " + std::to_string(lines.size()) + " videos of " +
                          (s.location.empty() ? "folder " + find(s.t, "folder")->value.str : s.location) +
                          (s.repeats > 1 ? " x " + std::to_string(s.repeats) + " repeats" : ""));
  }
  if (skipped > 5) plan->notes.push_back(std::to_string(skipped) + " rows left out in all");
  if (rows == 0) fail(datasets[0]->line, "the datasets hold no usable rows");
  std::string path = (fs::path(plan->output) / name).string();
  plan->files.push_back({path, out});
  return path;
}

struct Recipe {
  std::vector<std::pair<std::string, std::string>> source, textencoder, trainer, sampler;
  std::string framerate;
};

// The defaults of pipelines/train-wan.pipeline and train-cogvideox.pipeline (docs/fine-tuning-wan.md,
// docs/fine-tuning-cogvideox.md), so that a config holds only what differs from the recipe.
Recipe recipe_for(const std::string &family) {
  Recipe r;
  if (family == "wan") {
    r.source = {{"buckets", "832x480,480x832,624x624"}, {"frame-buckets", "81,49,33"}, {"fps", "16"},
                {"num-frames", "81"}, {"width", "832"}, {"height", "480"}, {"num-epochs", "0"}, {"prefetch", "2"}};
    r.textencoder = {{"max-length", "512"}, {"caption-dropout", "0.1"}};
    r.trainer = {{"lr", "1e-5"}, {"max-steps", "2000"}, {"gradient-checkpointing", "true"}, {"flow-shift", "3.0"},
                 {"timestep-sampling", "logit-normal"}, {"save-dtype", "bf16"}, {"checkpoint-every", "250"}};
    r.sampler = {{"every", "250"}, {"at-start", "true"}, {"steps", "50"}, {"guidance", "5.0"},
                 {"num-frames", "81"}, {"width", "832"}, {"height", "480"}};
    r.framerate = "16";
  } else if (family == "cogvideox") {
    r.source = {{"buckets", "720x480,480x720"}, {"frame-buckets", "49"}, {"fps", "8"}, {"num-frames", "49"},
                {"width", "720"}, {"height", "480"}, {"num-epochs", "0"}, {"prefetch", "2"}};
    r.textencoder = {{"max-length", "226"}, {"caption-dropout", "0.0"}};
    r.trainer = {{"lr", "1e-5"}, {"max-steps", "2000"}, {"gradient-checkpointing", "true"}, {"save-dtype", "bf16"},
                 {"checkpoint-every", "250"}};
    r.sampler = {{"every", "250"}, {"at-start", "true"}, {"steps", "50"}, {"num-frames", "49"}, {"width", "720"},
                 {"height", "480"}};
    r.framerate = "8";
  }
  return r;
}

const std::map<std::string, std::vector<std::string>> kOwnKeys = {
    {"run", {"output", "ranks", "devices"}},
    {"model", {"folder", "transformer", "transformer-2", "vae", "text-encoder", "tokenizer"}},
    {"dataset", {"manifest", "folder", "repeats", "root", "path-column", "caption-column", "split"}},
    {"validator", {"manifest", "folder", "repeats", "root", "path-column", "caption-column", "split"}},
    {"sampler", {"prompts", "samples"}},
};
// Tables of element properties: table -> element.
const std::vector<std::pair<std::string, std::string>> kElementTables = {
    {"dataset", "csvvideosrc"},  // only the keys csvvideosrc takes for the whole run (below)
    {"csvvideosrc", "csvvideosrc"}, {"vaeencoder", "vaeencoder"},   {"textencoder", "textencoder"},
    {"microbatcher", "microbatcher"}, {"trainer", "ddptrainsink"},  {"validator", "ddpvalsink"},
    {"sampler", "ddpsampler"},       {"vaedecoder", "vaedecoder"},  {"samplesink", "samplesink"},
};
// Size keys a [[dataset]] may give: one csvvideosrc reads the merged manifest, so they are the
// run's and every dataset that gives one must give the same.
const std::vector<std::string> kDatasetSizeKeys = {"buckets", "frame-buckets", "width", "height", "num-frames", "fps"};

bool Builder::build(RunPlan *plan, std::string *error) try {
  std::ifstream in(path_);
  if (!in) {
    *error = path_ + ": cannot read the config";
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string perr;
  if (!toml::parse(ss.str(), &doc_, &perr))
    throw ConfigError{path_ + (perr.compare(0, 5, "line ") == 0 ? ":" + perr.substr(5) : ": " + perr)};
  if (!doc_.tables[0].entries.empty()) {
    const Entry &e = doc_.tables[0].entries[0];
    fail(e.line, "'" + e.key + "' stands before any [table]: put run settings under [run]");
  }
  base_ = fs::absolute(path_).parent_path();

  // Tables and keys: every table known, [[dataset]] an array, the others plain.
  std::vector<std::string> table_names;
  for (const auto &t : kElementTables) table_names.push_back(t.first);
  table_names.push_back("run");
  table_names.push_back("model");
  for (size_t i = 1; i < doc_.tables.size(); i++) {
    const Table &t = doc_.tables[i];
    if (std::find(table_names.begin(), table_names.end(), t.name) == table_names.end())
      fail(t.line, "unknown table [" + t.name + "]" + did_you_mean(t.name, table_names) +
                       "; the tables are [run], [model], [[dataset]], [csvvideosrc], [vaeencoder], [textencoder], "
                       "[microbatcher], [trainer], [validator], [sampler], [vaedecoder], [samplesink]");
    if (t.name == "dataset" && !t.array_item) fail(t.line, "write [[dataset]] (one such table per dataset)");
    if (t.name != "dataset" && t.array_item) fail(t.line, "write [" + t.name + "]: there is one of it per run");
    if (t.name == "run" || t.name == "model") {
      const auto &own = kOwnKeys.at(t.name);
      for (const auto &e : t.entries)
        if (std::find(own.begin(), own.end(), e.key) == own.end())
          fail(e.line, "unknown key '" + e.key + "' in [" + t.name + "]" + did_you_mean(e.key, own));
    }
    if (t.name == "dataset")
      for (const auto &e : t.entries) {
        const auto &own = kOwnKeys.at("dataset");
        if (std::find(own.begin(), own.end(), e.key) != own.end()) continue;
        if (std::find(kDatasetSizeKeys.begin(), kDatasetSizeKeys.end(), e.key) == kDatasetSizeKeys.end()) {
          std::vector<std::string> all = own;
          all.insert(all.end(), kDatasetSizeKeys.begin(), kDatasetSizeKeys.end());
          fail(e.line, "unknown key '" + e.key + "' in [[dataset]]" + did_you_mean(e.key, all) +
                           " (other csvvideosrc properties go in [csvvideosrc])");
        }
      }
  }

  const Table *run = single("run");
  const Entry *out = find(run, "output");
  if (!out) fail(run ? run->line : 0, "[run] output = \"runs/NAME\" is missing (the run's folder: checkpoints, manifests, pipeline.txt)");
  plan->output = path_of(*out, false);
  if (const Entry *r = find(run, "ranks")) {
    if (r->value.kind != Value::Kind::Integer || r->value.integer < 1 || r->value.integer > 1024)
      fail(r->line, "'ranks' in [run] is an integer from 1 to 1024");
    plan->ranks = static_cast<int>(r->value.integer);
  }
  if (const Entry *d = find(run, "devices")) {
    std::string v = d->value.kind == Value::Kind::Array ? "" : string_of(run, "devices");
    if (d->value.kind == Value::Kind::Array)
      for (const auto &x : d->value.items) {
        if (x.kind != Value::Kind::Integer || x.integer < 0) fail(d->line, "'devices' in [run] lists GPU indices: [0, 1]");
        v += (v.empty() ? "" : ",") + std::to_string(x.integer);
      }
    for (char c : v)
      if (!isdigit(static_cast<unsigned char>(c)) && c != ',')
        fail(d->line, "'devices' in [run] lists GPU indices: \"0,1\" or [0, 1]");
    if (v.empty()) fail(d->line, "'devices' in [run] is empty");
    plan->devices = v;
    g_setenv("CUDA_VISIBLE_DEVICES", v.c_str(), TRUE);  // before LibTorch sees CUDA
  }

  // Model folders.
  const Table *model = single("model");
  std::string folder, transformer, vae, text_encoder, tokenizer;
  if (const Entry *f = find(model, "folder")) folder = path_of(*f, true, true);
  auto model_path = [&](const char *key, const char *sub, bool dir) -> std::string {
    if (const Entry *e = find(model, key)) {
      if (e->value.kind == Value::Kind::String && e->value.str.rfind("builtin:", 0) == 0) return e->value.str;
      return path_of(*e, true, dir);
    }
    if (!folder.empty() && fs::exists(fs::path(folder) / sub)) return (fs::path(folder) / sub).string();
    return "";
  };
  transformer = model_path("transformer", "transformer", false);
  vae = model_path("vae", "vae", false);
  text_encoder = model_path("text-encoder", "text_encoder", false);
  tokenizer = model_path("tokenizer", "tokenizer", false);
  // Wan 2.2 A14B in one job: the low-noise expert (ddptrainsink model-2), only when named.
  std::string transformer_2;
  if (const Entry *e = find(model, "transformer-2")) transformer_2 = path_of(*e, true, true);
  const int model_line = model ? model->line : 0;
  if (transformer.empty()) fail(model_line, "[model] names no transformer (transformer = \"DIR\" or folder = \"DIR\" holding transformer/)");
  if (vae.empty()) fail(model_line, "[model] names no VAE (vae = \"DIR\" or folder = \"DIR\" holding vae/)");
  if (!text_encoder.empty() && tokenizer.empty()) {
    fs::path sib = fs::path(text_encoder).parent_path() / "tokenizer";
    if (fs::is_directory(text_encoder) && fs::exists(fs::path(text_encoder) / "spiece.model")) tokenizer = text_encoder;
    else if (fs::exists(sib)) tokenizer = sib.string();
    else fail(model_line, "[model] names a text-encoder but no tokenizer (tokenizer = \"DIR\")");
  }
  std::string family = "none";
  if (fs::is_directory(transformer)) {
    std::ifstream cf(fs::path(transformer) / "config.json");
    nlohmann::json j = nlohmann::json::parse(cf, nullptr, false);
    std::string cls = j.is_object() && j.contains("_class_name") && j["_class_name"].is_string() ? j["_class_name"].get<std::string>() : "";
    if (cls == "WanTransformer3DModel") family = "wan";
    else if (cls == "CogVideoXTransformer3DModel") family = "cogvideox";
  }
  if (family != "none" && text_encoder.empty())
    fail(model_line, "[model] names no text-encoder: a " + family + " transformer trains on caption embeddings");
  plan->notes.push_back("model family: " + (family == "none" ? std::string("none (no recipe defaults)") : family));
  Recipe rec = recipe_for(family);

  // Datasets and the training source.
  std::vector<const Table *> datasets;
  for (const auto &t : doc_.tables)
    if (t.name == "dataset") datasets.push_back(&t);
  if (datasets.empty()) fail(0, "no [[dataset]]: give at least one (manifest = \"train.csv\" or folder = \"videos/\")");
  Stage src{"csvvideosrc", {}};
  for (const auto &p : rec.source) src.set(p.first, p.second);
  std::map<std::string, std::pair<std::string, int>> size_keys;  // key -> value, line
  for (const Table *t : datasets)
    for (const auto &e : t->entries) {
      if (std::find(kDatasetSizeKeys.begin(), kDatasetSizeKeys.end(), e.key) == kDatasetSizeKeys.end()) continue;
      std::string v = property_value("csvvideosrc", *t, e);
      auto it = size_keys.find(e.key);
      if (it != size_keys.end() && it->second.first != v)
        fail(e.line, "'" + e.key + "' = " + e.value.source + " differs from line " + std::to_string(it->second.second) +
                         ": one csvvideosrc reads every dataset (one merged manifest), so sizes and buckets are the run's; "
                         "give the same value or put it in [csvvideosrc]");
      size_keys[e.key] = {v, e.line};
      src.set(e.key, v);
    }
  const Table *trainer_t = single("trainer");
  if (const Entry *seed = find(trainer_t, "seed")) src.set("seed", property_value("ddptrainsink", *trainer_t, *seed));
  apply(single("csvvideosrc"), "csvvideosrc", &src, {},
        {{"location", "from [[dataset]]"}, {"root", "per [[dataset]]"}, {"path-column", "per [[dataset]]"},
         {"caption-column", "per [[dataset]]"}, {"split", "per [[dataset]]"}});
  std::vector<std::pair<std::string, std::string>> src_props = src.props;
  src.props.clear();
  src.set("location", manifest_for(datasets, "train.csv", plan));
  for (const auto &p : src_props) src.set(p.first, p.second);

  Stage enc{"vaeencoder", {{"model", vae}}};
  if (family != "none") enc.set("latent", "sample");
  apply(single("vaeencoder"), "vaeencoder", &enc, {}, {{"model", "[model] vae"}});

  Stage text{"textencoder", {}};
  if (!text_encoder.empty()) {
    text.set("tokenizer", tokenizer);
    text.set("model", text_encoder);
    for (const auto &p : rec.textencoder) text.set(p.first, p.second);
    apply(single("textencoder"), "textencoder", &text, {}, {{"model", "[model] text-encoder"}, {"tokenizer", "[model] tokenizer"}});
  } else if (const Table *t = single("textencoder")) {
    fail(t->line, "[textencoder] is given but [model] names no text-encoder");
  }

  Stage mb{"microbatcher", {}};
  if (family != "none") mb.set("batch-size", "1"), mb.set("micro-batch-size", "1");
  apply(single("microbatcher"), "microbatcher", &mb, {}, {});

  Stage trainer{"ddptrainsink", {{"name", "trainer"}, {"model", transformer}}};
  for (const auto &p : rec.trainer) trainer.set(p.first, p.second);
  if (!transformer_2.empty()) trainer.set("model-2", transformer_2);
  trainer.set("checkpoint-dir", plan->output);
  trainer.set("log-every", "1");
  trainer.set("metrics-file", (fs::path(plan->output) / "metrics.jsonl").string());
  apply(trainer_t, "ddptrainsink", &trainer, {},
        {{"model", "[model] transformer"}, {"checkpoint-dir", "[run] output"}});

  std::vector<std::string> chains;
  std::string main_chain = render(src) + "\n  ! " + render(enc);
  if (!text_encoder.empty()) main_chain += "\n  ! " + render(text);
  main_chain += "\n  ! queue max-size-buffers=16\n  ! " + render(mb) + "\n  ! " + render(trainer);
  chains.push_back(main_chain);

  // Validation: a source of its own (docs/elements/ddpvalsink.md), its clips centred, the latents' mode.
  if (const Table *val = single("validator")) {
    if (!find(val, "manifest") && !find(val, "folder"))
      fail(val->line, "[validator] names no validation data: manifest = \"val.csv\" or folder = \"val-videos/\"");
    if (find(val, "repeats")) fail(find(val, "repeats")->line, "'repeats' is for training datasets, not [validator]");
    Stage vsrc{"csvvideosrc", {}};
    vsrc.set("location", manifest_for({val}, "val.csv", plan));
    vsrc.set("num-epochs", "0");
    vsrc.set("shuffle", "false");
    vsrc.set("clip-start", "center");
    for (const char *k : {"num-frames", "width", "height", "fps", "frame-stride", "resize-mode"})
      if (const std::string *v = src.get(k)) vsrc.set(k, *v);
    vsrc.set("prefetch", "1");
    Stage venc = enc;
    venc.set("latent", "mode");
    Stage vtext = text;
    if (!text_encoder.empty()) vtext.set("caption-dropout", "0");
    Stage vsink{"ddpvalsink", {{"trainer", "trainer"}}};
    apply(val, "ddpvalsink", &vsink, {kOwnKeys.at("validator").begin(), kOwnKeys.at("validator").end()},
          {{"trainer", "set to the run's trainer"}});
    std::string c = render(vsrc) + "\n  ! " + render(venc);
    if (!text_encoder.empty()) c += "\n  ! " + render(vtext);
    chains.push_back(c + "\n  ! queue\n  ! " + render(vsink));
  }

  // Sample videos: promptsrc ! textencoder ! ddpsampler ! queue ! vaedecoder ! samplesink.
  if (const Table *smp = single("sampler")) {
    const Entry *prompts = find(smp, "prompts");
    if (!prompts) fail(smp->line, "[sampler] names no prompts: prompts = \"prompts.txt\" (one a line, or a CSV)");
    if (text_encoder.empty()) fail(smp->line, "[sampler] needs a text-encoder in [model]");
    Stage ps{"promptsrc", {{"location", path_of(*prompts, true)}}};
    Stage stext = text;
    stext.set("caption-dropout", "0");
    Stage sampler{"ddpsampler", {{"trainer", "trainer"}}};
    for (const auto &p : rec.sampler) sampler.set(p.first, p.second);
    if (const std::string *fsh = trainer.get("flow-shift")) sampler.set("flow-shift", *fsh);
    apply(smp, "ddpsampler", &sampler, {"prompts", "samples"}, {{"trainer", "set to the run's trainer"}});
    Stage dec{"vaedecoder", {{"model", vae}}};
    const std::string *fps = src.get("fps");
    std::string rate = fps && *fps != "0" && *fps != "0.0" ? *fps : rec.framerate;
    if (!rate.empty()) dec.set("framerate", rate);
    apply(single("vaedecoder"), "vaedecoder", &dec, {}, {{"model", "[model] vae"}});
    std::string samples = (fs::path(plan->output) / "samples").string();
    if (const Entry *s = find(smp, "samples")) samples = path_of(*s, false);
    Stage sink{"samplesink", {{"trainer", "trainer"}, {"location", (fs::path(samples) / "step-%08d/prompt-%02d.mp4").string()}}};
    apply(single("samplesink"), "samplesink", &sink, {},
          {{"trainer", "set to the run's trainer"}, {"location", "[sampler] samples (a folder)"}});
    chains.push_back(render(ps) + "\n  ! " + render(stext) + "\n  ! " + render(sampler) + "\n  ! queue\n  ! " +
                     render(dec) + "\n  ! " + render(sink));
  } else {
    for (const char *t : {"vaedecoder", "samplesink"})
      if (const Table *x = single(t)) fail(x->line, "[" + std::string(t) + "] is only used with [sampler]");
  }

  std::string text_form = "# built by videotrain-run --config " + fs::absolute(path_).lexically_normal().string() + "\n";
  for (const auto &c : chains) {
    std::string with_breaks;
    for (char ch : c) with_breaks += ch == '\n' ? std::string(" \\\n") : std::string(1, ch);
    text_form += with_breaks + "\n";
    std::string flat;
    for (char ch : c) flat += ch == '\n' ? ' ' : ch;
    plan->pipeline += (plan->pipeline.empty() ? "" : "  ") + flat;
  }
  plan->text = text_form;
  return true;
} catch (const ConfigError &e) {
  *error = e.message;
  return false;
}

bool write_file(const std::string &path, const std::string &text, std::string *error) {
  std::string tmp = path + ".tmp-" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    f.flush();
    if (!f) {
      *error = "cannot write " + tmp;
      fs::remove(tmp);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    *error = "cannot rename " + tmp + " to " + path + ": " + ec.message();
    fs::remove(tmp);
    return false;
  }
  return true;
}

}  // namespace

bool build_run_plan(const std::string &config_path, RunPlan *plan, std::string *error) {
  Builder b(config_path);
  return b.build(plan, error);
}

bool write_run_files(const RunPlan &plan, const std::string &config_path, std::string *error) {
  std::error_code ec;
  fs::create_directories(plan.output, ec);
  if (ec) {
    *error = "cannot create the run's folder " + plan.output + ": " + ec.message();
    return false;
  }
  for (const auto &f : plan.files)
    if (!write_file(f.path, f.text, error)) return false;
  std::ifstream in(config_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return write_file((fs::path(plan.output) / "config.toml").string(), ss.str(), error) &&
         write_file((fs::path(plan.output) / "pipeline.txt").string(), plan.text, error);
}

}  // namespace videotrain
