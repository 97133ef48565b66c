#include "eval/eval_plan.h"

#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "eval/model_source.h"
#include "plan/target.h"

namespace easyctx::eval {
namespace {

// The evaluation flag of a config key the plan's knobs change.
std::string flag_of(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string key = assignment.substr(0, eq), value = eq == std::string::npos ? "" : assignment.substr(eq + 1);
  if (key == "activation.attention_head_groups") return "--attention-head-groups " + value;
  if (key == "activation.mlp_tile") return "--mlp-tile " + value;
  if (key == "activation.lm_head_tile") return "--lm-head-tile " + value;
  if (key == "parallel.sequence.size") return "--sp-size " + value;
  return "--set " + assignment;
}

std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

plan::MemoryPlan plan_session(const SessionOptions& o, int64_t max_tokens, const std::vector<std::string>& sets,
                              int world_size, int ranks_per_node) {
  EASYCTX_CHECK_INPUT(max_tokens >= 1, "--plan: the longest sequence is ", max_tokens, " tokens");
  StageConfig cfg = session_config(o);
  cfg.train.device = o.device;
  cfg.data.seq_length = max_tokens;
  for (const std::string& s : sets) {
    EASYCTX_CHECK_INPUT(starts_with(s, "target."), "--set ", s,
                        ": only target.* keys (the machine the plan is for: "
                        "target.gpu, target.gpu_memory_gib, target.gpus_per_node, target.nodes, "
                        "target.host_memory_gib, target.headroom); the run's shape has its own flags");
    apply_override(cfg, s);
  }
  EASYCTX_CHECK_INPUT(o.sp_size >= 1, "--sp-size: ", o.sp_size, " (must be >= 1)");
  const ModelRef ref = o.resolved ? *o.resolved : resolve_model(o.model);  // (a program's: verified already)
  plan::InferencePlanInput in;
  in.model = model_config(ref, o.rope_theta);
  in.cfg = cfg;
  in.load_staging_elems = load_staging_elems(ref, model::ParamLayout(in.model));
  EASYCTX_CHECK_INPUT(in.model.num_kv_heads % o.attention_head_groups == 0,
                      "--attention-head-groups: ", o.attention_head_groups,
                      " does not divide the model's key/value heads (", in.model.num_kv_heads, ")");
  return plan::plan_inference(in, plan::resolve_target(cfg, world_size, ranks_per_node));
}

std::string session_refusal(const plan::MemoryPlan& p) {
  if (p.fits) return "";
  std::string msg = plan::refusal_message(p);
  const size_t cut = msg.find(" Would fit:");
  const size_t none = msg.find(" Nothing makes it fit");
  msg = msg.substr(0, std::min(cut, none));
  if (p.knobs.empty())
    return msg +
           " Nothing makes it fit alone: not --attention-head-groups, --mlp-tile, "
           "--lm-head-tile nor --sp-size; use GPUs with more memory.";
  std::ostringstream os;
  os << msg << " Would fit:";
  for (size_t i = 0; i < p.knobs.size(); ++i) {
    const plan::KnobFix& k = p.knobs[i];
    os << (i ? "; " : " ") << flag_of(k.assignment) << " ("
       << (k.gpu_bytes > 0 ? gib(k.gpu_bytes) + " per GPU" : gib(k.host_bytes) + " per node")
       << (k.note.empty() ? "" : ", " + k.note) << ")";
  }
  return os.str() + ".";
}

std::string format_session_plan(const plan::MemoryPlan& p) {
  std::string s = plan::format_plan_table(p);
  if (!p.fits) s += "\n" + session_refusal(p) + "\n";
  Json j = plan::plan_to_json(p);
  if (!p.fits) j.set("message", session_refusal(p));
  return s + "\n" + j.dump() + "\n";
}

}  // namespace easyctx::eval
