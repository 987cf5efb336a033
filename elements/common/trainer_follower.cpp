/* See trainer_follower.h. */
#include "trainer_follower.h"

#include "string_property.h"

namespace videotrain {

namespace {
enum Prop : guint { kTrainer, kEvery, kAtStart, kSkipIfBusy, kWeights };
}

void follower_install_properties(GObjectClass *klass, guint first, const FollowerBlurbs &b, GType weights_type) {
  const FollowerSettings d;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  auto install = [&](guint id, GParamSpec *p) { g_object_class_install_property(klass, first + id, p); };
  install(kTrainer, g_param_spec_string("trainer", "Trainer", b.trainer, nullptr, rw));
  install(kEvery, g_param_spec_uint64("every", "Every", b.every, 0, G_MAXUINT64, d.every, rw));
  install(kAtStart, g_param_spec_boolean("at-start", "At start", b.at_start, d.at_start, rw));
  install(kSkipIfBusy, g_param_spec_boolean("skip-if-busy", "Skip if busy", b.skip_if_busy, d.skip_if_busy, rw));
  install(kWeights, g_param_spec_enum("weights", "Weights", b.weights, weights_type, d.ema ? 1 : 0, rw));
}

bool follower_set_property(TrainerFollower &f, FollowerSettings &s, guint first, guint id, const GValue *v) {
  if (id < first || id >= first + kFollowerProperties) return false;
  switch (id - first) {
    case kTrainer: f.trainer = string_property(v); break;
    case kEvery: s.every = g_value_get_uint64(v); break;
    case kAtStart: s.at_start = g_value_get_boolean(v); break;
    case kSkipIfBusy: s.skip_if_busy = g_value_get_boolean(v); break;
    case kWeights: s.ema = g_value_get_enum(v) == 1; break;
  }
  return true;
}

bool follower_get_property(const TrainerFollower &f, const FollowerSettings &s, guint first, guint id, GValue *v) {
  if (id < first || id >= first + kFollowerProperties) return false;
  switch (id - first) {
    case kTrainer: set_string_property(v, f.trainer); break;
    case kEvery: g_value_set_uint64(v, s.every); break;
    case kAtStart: g_value_set_boolean(v, s.at_start); break;
    case kSkipIfBusy: g_value_set_boolean(v, s.skip_if_busy); break;
    case kWeights: g_value_set_enum(v, s.ema ? 1 : 0); break;
  }
  return true;
}

std::string follower_trainer(GstElement *element, const TrainerFollower &f) {
  GST_OBJECT_LOCK(element);
  std::string name = f.trainer;
  GST_OBJECT_UNLOCK(element);
  return name;
}

void follower_set_context(GstElement *element, TrainerFollower &f, GstContext *context) {
  run_context_take(element, context, follower_trainer(element, f), &f.run);
}

std::string follower_start_problem(GstElement *element, const TrainerFollower &f) {
  const std::string name = follower_trainer(element, f);
  if (name.empty()) return "No trainer: set the trainer property to the name of a ddptrainsink";
  return trainer_problem(element, name);
}

std::shared_ptr<RunContext> follower_run(GstElement *element, TrainerFollower &f, std::string *why) {
  const std::string name = follower_trainer(element, f);
  auto run = run_context_find(element, name, &f.run);
  if (run) return run;
  *why = follower_start_problem(element, f);
  if (why->empty())
    *why = "ddptrainsink '" + name + "' has not started (it must be in the same pipeline and not failed)";
  return nullptr;
}

}  // namespace videotrain
