// The plan as a table, as JSON, and next to what a run measured.
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <sstream>

#include "core/strings.h"
#include "plan/memory_plan.h"
#include "plan/plan_detail.h"

namespace easyctx::plan {
namespace {

using detail::gib;

std::string pct(double a, double b) {
  if (b <= 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * (a - b) / b);
  return buf;
}

Json item_json(const PlanItem& i) {
  return Json::object({{"name", i.name},
                       {"where", i.where},
                       {"bytes", i.bytes},
                       {"formula", i.formula},
                       {"transient", i.transient},
                       {"phase", i.phase},
                       {"tracked", i.tracked},
                       {"ranks", to_string(i.ranks)}});
}

// Whether item i is live in the phase a PhaseTotal of that name sums (memory_plan.cpp, totals).
bool live_in(const PlanItem& i, const std::string& phase) {
  return i.transient ? i.phase == phase : (phase != "init" || i.phase == "init");
}

// The bytes of `where` live in `phase` on world rank 0, by category (they sum to the phase's
// total there).
Json by_category(const MemoryPlan& p, const std::string& where, const std::string& phase) {
  int64_t context = 0, state = 0, acts = 0, transient = 0;
  for (const PlanItem& i : p.items) {
    if (i.where != where || i.ranks == Ranks::Others || !live_in(i, phase)) continue;
    int64_t& c = i.transient ? transient : i.phase == "init" ? (where == "gpu" && !i.tracked ? context : state) : acts;
    c += i.bytes;
  }
  Json j = Json::object();
  j.set("phase", phase);
  if (where == "gpu") j.set("context", context);
  j.set(where == "gpu" ? "model state" : "process and model state", state);
  j.set("activations", acts);
  j.set("transient", transient);
  return j;
}

// rank 0's host peak (what its VmHWM reads), over every phase or (before_export) over those
// before the HF export that ends a run.
int64_t root_host_peak(const MemoryPlan& p, bool before_export = false) {
  int64_t b = 0;
  for (const PhaseTotal& ph : p.phases)
    if (!before_export || ph.name.rfind("HF export", 0) != 0) b = std::max(b, ph.host_bytes);
  return b;
}

}  // namespace

std::string format_plan_table(const MemoryPlan& p) {
  const bool cuda = p.target.backend == DeviceKind::Cuda;
  std::ostringstream os;
  char line[512];
  os << "memory plan (docs/memory-model.md), per rank unless stated\n";
  os << "  model   " << p.model_name << ": " << format_count(static_cast<double>(p.parameters))
     << " parameters (P = " << p.parameters << ")\n";
  os << "  run     " << (cuda ? "cuda (bf16 activations)" : "cpu (f32)") << ", world " << p.world << " = " << p.dp
     << " data-parallel x " << p.sp << " sequence-parallel, ZeRO group " << p.zero_group << "; n = " << p.tokens
     << " tokens per rank per micro-step (S = " << p.local_len << " per sequence)\n";
  os << "  target  " << p.target.nodes << " node(s) x " << p.target.gpus_per_node
     << (cuda
             ? " GPU(s): " + p.target.gpu_name + " " + gib(p.target.gpu_memory_bytes) + " (" + p.target.gpu_source + ")"
             : " rank(s)")
     << ", host " << gib(p.target.host_memory_bytes) << " per node (" << p.target.host_source << "), headroom "
     << std::lround(100 * p.target.headroom) << "%\n\n";
  std::snprintf(line, sizeof line, "  %-5s %-34s %12s  %s\n", "where", "phase", "bytes", "buffer [formula]");
  os << line;
  for (const PlanItem& i : p.items) {
    std::string ph = i.transient ? i.phase : (i.phase == "init" ? "persistent" : "persistent (step)");
    if (i.ranks != Ranks::Every) ph += std::string(", ") + to_string(i.ranks);
    std::snprintf(line, sizeof line, "  %-5s %-34s %12s  %s [%s]\n", i.where.c_str(), ph.c_str(),
                  format_bytes(static_cast<double>(i.bytes)).c_str(), i.name.c_str(), i.formula.c_str());
    os << line;
  }
  os << "\n";
  if (!p.attention_routes.empty()) {
    os << "  attention calls of a step and their routes (ops/attention_route.h):\n";
    for (const std::string& r : p.attention_routes) os << "    " << r << "\n";
    os << "\n";
  }
  std::snprintf(line, sizeof line, "  %-34s %14s %14s %14s %14s\n", "phase totals", cuda ? "gpu allocs" : "allocations",
                cuda ? "gpu total" : "", "host/rank 0", "host/node");
  os << line;
  for (const PhaseTotal& ph : p.phases) {
    std::snprintf(line, sizeof line, "  %-34s %14s %14s %14s %14s\n", ph.name.c_str(),
                  format_bytes(static_cast<double>(ph.alloc_bytes)).c_str(),
                  cuda ? format_bytes(static_cast<double>(ph.gpu_bytes)).c_str() : "",
                  format_bytes(static_cast<double>(ph.host_bytes)).c_str(),
                  format_bytes(static_cast<double>(ph.host_node_bytes)).c_str());
    os << line;
  }
  os << "\n";
  if (cuda)
    os << "  GPU   peak allocations " << gib(p.alloc_peak_bytes) << " (" << p.alloc_peak_phase << ") + context "
       << gib(p.context_bytes) << " = " << gib(p.gpu_peak_bytes) << " per GPU; usable " << gib(p.gpu_usable) << " of "
       << gib(p.gpu_capacity) << ": " << (p.gpu_fits ? "fits" : "DOES NOT FIT") << "\n";
  else os << "  backend allocations peak " << gib(p.alloc_peak_bytes) << " per rank (" << p.alloc_peak_phase << ")\n";
  const int64_t rpn = p.target.gpus_per_node;
  if (p.host_peak_bytes == rpn * p.host_rank_peak_bytes + p.host_shared_bytes) {  // every rank alike at the peak
    os << "  host  peak " << gib(p.host_rank_peak_bytes) << " per rank (" << p.host_peak_phase << ") x " << rpn
       << " per node = " << gib(p.host_peak_bytes);
  } else {  // rank 0 holds more (the HF export's whole model): its node
    const PhaseTotal* at = nullptr;
    for (const PhaseTotal& ph : p.phases)
      if (ph.name == p.host_peak_phase) at = &ph;
    os << "  host  peak " << gib(p.host_rank_peak_bytes) << " per rank (" << p.host_rank_peak_phase << "); per node "
       << gib(p.host_peak_bytes) << " (" << p.host_peak_phase;
    if (at && at->host_node_bytes == at->host_bytes + (rpn - 1) * at->host_other_bytes)
      os << ": rank 0 " << gib(at->host_bytes) << " + " << rpn - 1 << " x " << gib(at->host_other_bytes);
    os << ")";
  }
  os << "; usable " << gib(p.host_usable) << " of " << gib(p.host_capacity) << ": "
     << (p.host_fits ? "fits" : "DOES NOT FIT") << "\n";
  for (const std::string& n : p.notes) os << "  note  " << n << "\n";
  return os.str();
}

namespace {

// What was planned for: the backend and the machine.
Json target_json(const PlanTarget& t) {
  return Json::object({{"backend", to_string(t.backend)},
                       {"gpu", t.gpu_name},
                       {"gpu_memory_bytes", t.gpu_memory_bytes},
                       {"gpu_source", t.gpu_source},
                       {"gpus_per_node", t.gpus_per_node},
                       {"nodes", t.nodes},
                       {"host_memory_bytes", t.host_memory_bytes},
                       {"host_source", t.host_source},
                       {"headroom", t.headroom}});
}

// The run's shape: model, layout, tokens.
Json run_json(const MemoryPlan& p) {
  return Json::object({{"model", p.model_name},
                       {"parameters", p.parameters},
                       {"trainable_parameters", p.trainable_parameters},
                       {"world", p.world},
                       {"data_parallel", p.dp},
                       {"sequence_parallel", p.sp},
                       {"zero_group", p.zero_group},
                       {"local_len", p.local_len},
                       {"tokens_per_rank", p.tokens}});
}

// One GPU's peak and capacity (a CPU plan's allocations are the host's).
Json gpu_json(const MemoryPlan& p) {
  const bool cuda = p.target.backend == DeviceKind::Cuda;
  Json g = Json::object({{"allocations_peak_bytes", cuda ? p.alloc_peak_bytes : 0},
                         {"context_bytes", p.context_bytes},
                         {"device_total_bytes", p.gpu_peak_bytes},
                         {"peak_phase", p.gpu_peak_phase},
                         {"capacity_bytes", p.gpu_capacity},
                         {"usable_bytes", p.gpu_usable},
                         {"fits", p.gpu_fits}});
  if (cuda) g.set("by_category", by_category(p, "gpu", p.gpu_peak_phase));
  return g;
}

// A rank's and a node's host peak and the node's capacity.
Json host_json(const MemoryPlan& p) {
  const bool cuda = p.target.backend == DeviceKind::Cuda;
  return Json::object({{"backend_allocations_peak_bytes", cuda ? 0 : p.alloc_peak_bytes},
                       {"per_rank_peak_bytes", p.host_rank_peak_bytes},
                       {"per_rank_peak_phase", p.host_rank_peak_phase},
                       {"rank0_peak_bytes", root_host_peak(p)},
                       {"peak_phase", p.host_peak_phase},
                       {"shared_bytes", p.host_shared_bytes},
                       {"per_node_peak_bytes", p.host_peak_bytes},
                       {"ranks_per_node", p.target.gpus_per_node},
                       {"by_category", by_category(p, "host", p.host_peak_phase)},
                       {"capacity_bytes", p.host_capacity},
                       {"usable_bytes", p.host_usable},
                       {"fits", p.host_fits}});
}

Json phases_json(const std::vector<PhaseTotal>& phases) {
  Json a = Json::array();
  for (const PhaseTotal& ph : phases)
    a.push_back(Json::object({{"name", ph.name},
                              {"allocations_bytes", ph.alloc_bytes},
                              {"gpu_bytes", ph.gpu_bytes},
                              {"host_bytes", ph.host_bytes},
                              {"host_other_bytes", ph.host_other_bytes},
                              {"host_node_bytes", ph.host_node_bytes}}));
  return a;
}

Json knobs_json(const std::vector<KnobFix>& knobs) {
  Json a = Json::array();
  for (const KnobFix& k : knobs)
    a.push_back(Json::object({{"set", k.assignment},
                              {"note", k.note},
                              {"gpu_bytes", k.gpu_bytes},
                              {"host_bytes", k.host_bytes},
                              {"nodes", k.nodes},
                              {"gpus_per_node", k.gpus_per_node}}));
  return a;
}

}  // namespace

Json plan_to_json(const MemoryPlan& p) {
  Json j = Json::object();
  j.set("fits", p.fits);
  j.set("target", target_json(p.target));
  j.set("run", run_json(p));
  j.set("settings", p.settings.is_null() ? Json::object() : p.settings);
  j.set("gpu", gpu_json(p));
  j.set("host", host_json(p));
  j.set("allocations_peak_bytes", p.alloc_peak_bytes);
  j.set("allocations_peak_phase", p.alloc_peak_phase);
  Json items = Json::array();
  for (const PlanItem& i : p.items) items.push_back(item_json(i));
  j.set("items", items);
  j.set("attention_routes", Json::array_of(p.attention_routes));
  j.set("phases", phases_json(p.phases));
  j.set("knobs", knobs_json(p.knobs));
  j.set("notes", Json::array_of(p.notes));
  if (!p.fits) j.set("message", refusal_message(p));
  return j;
}

std::string compare_line(const MemoryPlan& p, const ops::MemoryStats& m, double host_hwm_bytes,
                         double device_used_bytes) {
  const bool cuda = p.target.backend == DeviceKind::Cuda;
  std::ostringstream os;
  const double measured = static_cast<double>(m.peak_bytes);
  os << "memory: predicted peak " << gib(p.alloc_peak_bytes) << (cuda ? " per GPU" : " per rank") << " (allocations, "
     << p.alloc_peak_phase << "), measured " << gib(m.peak_bytes) << " (plan "
     << pct(static_cast<double>(p.alloc_peak_bytes), measured) << ")";
  if (cuda) {
    os << "; device total predicted " << gib(p.gpu_peak_bytes) << " incl. " << gib(p.context_bytes) << " context";
    if (device_used_bytes >= 0)
      os << ", measured " << gib(static_cast<int64_t>(device_used_bytes)) << " (cudaMemGetInfo, plan "
         << pct(static_cast<double>(p.gpu_peak_bytes), device_used_bytes) << ")";
    os << "; scratch pool reserved peak " << gib(m.scratch_peak_bytes);
  }
  const int64_t host = root_host_peak(p, true);  // (rank 0's line, printed before the HF export)
  os << "; host predicted " << gib(host) << " on rank 0";
  if (host_hwm_bytes >= 0)
    os << ", measured " << gib(static_cast<int64_t>(host_hwm_bytes)) << " (VmHWM, plan "
       << pct(static_cast<double>(host), host_hwm_bytes) << ")";
  return os.str();
}

}  // namespace easyctx::plan
