/* A RunContext travelling through GstContext (no torch).
 *
 * ddptrainsink posts GST_MESSAGE_HAVE_CONTEXT with a context of type
 * "videotrain-run/<its name>" when it starts (and an empty one of the same type when it
 * stops); the bins keep the newest of each type and answer a NEED_CONTEXT of that type by
 * calling set_context on the asking element. The context's structure holds the run in a
 * boxed field, so it lives per pipeline and goes with it. */
#pragma once

#include <gst/gst.h>

#include <memory>
#include <string>

#include "run_context.h"

namespace videotrain {

// The context type of the run of the trainer element named `trainer_name`.
std::string run_context_type(const std::string &trainer_name);

// The boxed type of the "run" field: a heap std::shared_ptr<RunContext>.
GType run_context_ref_get_type();

// A (non-persistent) context of run_context_type(trainer_name) holding `run`; with null, an
// empty one that says the trainer has stopped.
GstContext *run_context_new(const std::string &trainer_name, std::shared_ptr<RunContext> run);
// The run a context holds; null for an empty context or one of another type.
std::shared_ptr<RunContext> run_context_get(GstContext *context);

// Trainer side: posts HAVE_CONTEXT with run_context_new() from `trainer`.
void run_context_publish(GstElement *trainer, std::shared_ptr<RunContext> run);
// Trainer side: answers a GST_QUERY_CONTEXT of its type; false for any other query.
bool run_context_answer_query(GstQuery *query, const std::string &trainer_name, std::shared_ptr<RunContext> run);

// Validator side: posts NEED_CONTEXT for the run of `trainer_name` from `element`; a bin that
// holds one answers at once through the element's set_context.
void run_context_request(GstElement *element, const std::string &trainer_name);

// Validator side, without a run yet: "" when the top-level bin of `element` holds a ddptrainsink
// called `name` (looked up by type name: the elements share no headers), else what is wrong.
std::string trainer_problem(GstElement *element, const std::string &name);

}  // namespace videotrain
