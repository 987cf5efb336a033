/* See run_context_gst.h. */
#include "run_context_gst.h"

namespace videotrain {

namespace {

constexpr const char *kTypePrefix = "videotrain-run/";
constexpr const char *kField = "run";

using RunRef = std::shared_ptr<RunContext>;

gpointer ref_copy(gpointer p) { return new RunRef(*static_cast<RunRef *>(p)); }
void ref_free(gpointer p) { delete static_cast<RunRef *>(p); }

// What gst-launch-1.0 prints for the field ("Got context from element ..."), instead of NULL.
void ref_to_string(const GValue *from, GValue *to) {
  auto *ref = static_cast<const RunRef *>(g_value_get_boxed(from));
  if (!ref || !*ref) {
    g_value_set_string(to, "none");
    return;
  }
  const RunContext &r = **ref;
  g_value_take_string(to, g_strdup_printf("rank %d of %d on %s", r.rank(), r.world_size(), r.device_name().c_str()));
}

}  // namespace

std::string run_context_type(const std::string &trainer_name) { return kTypePrefix + trainer_name; }

GType run_context_ref_get_type() {
  static GType type = 0;
  if (g_once_init_enter(&type)) {
    // A program that links this file and also loads the plugin (the tests) has two copies:
    // the first registers the type, the other takes it (same layout, same functions).
    GType t = g_type_from_name("GstVideoTrainRunContextRef");
    if (!t) {
      t = g_boxed_type_register_static("GstVideoTrainRunContextRef", ref_copy, ref_free);
      g_value_register_transform_func(t, G_TYPE_STRING, ref_to_string);
    }
    g_once_init_leave(&type, t);
  }
  return type;
}

GstContext *run_context_new(const std::string &trainer_name, std::shared_ptr<RunContext> run) {
  GstContext *c = gst_context_new(run_context_type(trainer_name).c_str(), FALSE);
  GstStructure *s = gst_context_writable_structure(c);
  gst_structure_set(s, "trainer", G_TYPE_STRING, trainer_name.c_str(), NULL);
  if (run) {
    RunRef ref = std::move(run);
    gst_structure_set(s, kField, run_context_ref_get_type(), &ref, NULL);  // copies the pointer
  }
  return c;
}

std::shared_ptr<RunContext> run_context_get(GstContext *context) {
  if (!context || !g_str_has_prefix(gst_context_get_context_type(context), kTypePrefix)) return nullptr;
  const GstStructure *s = gst_context_get_structure(context);
  const GValue *v = gst_structure_get_value(s, kField);
  if (!v || !G_VALUE_HOLDS(v, run_context_ref_get_type())) return nullptr;
  auto *ref = static_cast<const RunRef *>(g_value_get_boxed(v));
  return ref ? *ref : nullptr;
}

void run_context_publish(GstElement *trainer, std::shared_ptr<RunContext> run) {
  gchar *name = gst_object_get_name(GST_OBJECT(trainer));
  GstContext *c = run_context_new(name ? name : "", std::move(run));
  g_free(name);
  gst_element_post_message(trainer, gst_message_new_have_context(GST_OBJECT(trainer), c));
}

bool run_context_answer_query(GstQuery *query, const std::string &trainer_name, std::shared_ptr<RunContext> run) {
  const gchar *type = nullptr;
  if (GST_QUERY_TYPE(query) != GST_QUERY_CONTEXT || !gst_query_parse_context_type(query, &type) || !type ||
      run_context_type(trainer_name) != type || !run)
    return false;
  GstContext *c = run_context_new(trainer_name, std::move(run));
  gst_query_set_context(query, c);
  gst_context_unref(c);
  return true;
}

void run_context_request(GstElement *element, const std::string &trainer_name) {
  const std::string type = run_context_type(trainer_name);
  gst_element_post_message(element, gst_message_new_need_context(GST_OBJECT(element), type.c_str()));
}

std::string trainer_problem(GstElement *element, const std::string &name) {
  GstObject *top = GST_OBJECT(gst_object_ref(element));
  while (GstObject *p = gst_object_get_parent(top)) {
    gst_object_unref(top);
    top = p;
  }
  GstElement *t = GST_IS_BIN(top) ? gst_bin_get_by_name(GST_BIN(top), name.c_str()) : nullptr;
  gst_object_unref(top);
  if (!t) return "No element named '" + name + "' in this pipeline (property trainer: the name of a ddptrainsink)";
  const GType trainer_type = g_type_from_name("GstDdpTrainSink");
  const bool is_trainer = trainer_type && G_TYPE_CHECK_INSTANCE_TYPE(t, trainer_type);
  std::string why;
  if (!is_trainer) why = "Element '" + name + "' is a " + G_OBJECT_TYPE_NAME(t) + ", not a ddptrainsink (property trainer)";
  gst_object_unref(t);
  return why;
}

}  // namespace videotrain
