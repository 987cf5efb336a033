/* The GObject half that ddpvalsink and ddpsampler share as followers of a ddptrainsink: the
 * properties trainer, every, at-start, skip-if-busy and weights (specs, ranges and defaults
 * written once; each element words its blurbs), and finding the trainer's run through the run
 * context (run_context_gst.h). No torch. */
#pragma once

#include <gst/gst.h>

#include <memory>
#include <string>

#include "follower_settings.h"
#include "run_context_gst.h"

namespace videotrain {

// The GEnumValue entries of the `weights` property (VIDEOTRAIN_DEFINE_ENUM; FollowerSettings::ema).
#define VIDEOTRAIN_FOLLOWER_WEIGHTS_ENUM_VALUES \
  {0, "The trainer's weights", "raw"}, {1, "The trainer's EMA of its trainable parameters (needs its ema-decay)", "ema"}

// The trainer's name (property trainer) and its run once found; under the element's object lock.
struct TrainerFollower {
  std::string trainer;
  std::shared_ptr<RunContext> run;  // from set_context
};

// Each element's words for the shared properties.
struct FollowerBlurbs {
  const char *trainer, *every, *at_start, *skip_if_busy, *weights;
};

// The shared properties take the ids first .. first + kFollowerProperties - 1.
constexpr guint kFollowerProperties = 5;
void follower_install_properties(GObjectClass *klass, guint first, const FollowerBlurbs &blurbs, GType weights_type);
// For set_property / get_property, with the object lock held: false when `id` is not one of them.
bool follower_set_property(TrainerFollower &f, FollowerSettings &s, guint first, guint id, const GValue *value);
bool follower_get_property(const TrainerFollower &f, const FollowerSettings &s, guint first, guint id, GValue *value);

// The trainer's name, read under the object lock.
std::string follower_trainer(GstElement *element, const TrainerFollower &f);
// For the element's set_context: keeps the run of a context of its trainer (null: it stopped).
void follower_set_context(GstElement *element, TrainerFollower &f, GstContext *context);
// At start: "" when `trainer` names a ddptrainsink of this pipeline (started or not), else what is wrong.
std::string follower_start_problem(GstElement *element, const TrainerFollower &f);
// The trainer's run (asked of the bins unless held); null with *why when the trainer is missing, is
// not a ddptrainsink, or has not started.
std::shared_ptr<RunContext> follower_run(GstElement *element, TrainerFollower &f, std::string *why);

}  // namespace videotrain
