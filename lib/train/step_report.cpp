#include "train/step_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/log.h"
#include "core/strings.h"
#include "ops/backend_factory.h"
#include "ops/profile.h"
#include "plan/target.h"

namespace easyctx::train {
namespace fs = std::filesystem;
namespace {

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// The numbers of a metrics record as TensorBoard scalars (metrics.jsonl is the reference).
std::vector<tb::Scalar> tensorboard_scalars(const Json& record) {
  std::vector<tb::Scalar> v;
  for (const auto& [key, value] : record.as_object()) {
    if (key == "step") continue;
    if (value.is_number()) v.emplace_back("train/" + key, static_cast<float>(value.as_double()));
    else if (value.is_bool()) v.emplace_back("train/" + key, value.as_bool() ? 1.0f : 0.0f);
  }
  return v;
}

}  // namespace

StepReporter::StepReporter(const StageConfig& cfg, ops::Backend& be, int world_size, bool root, double flops_per_token,
                           double attention_flops_per_token)
    : cfg_(cfg),
      be_(be),
      world_size_(world_size),
      root_(root),
      flops_per_token_(flops_per_token),
      attention_flops_per_token_(attention_flops_per_token),
      prof_(dynamic_cast<ops::ProfilingBackend*>(&be)) {
  peak_flops_ = ops::device_info(be_).peak_flops;
}

StepReporter::~StepReporter() = default;

void StepReporter::log_device() const {
  if (be_.memspace() != MemSpace::Device || !root_) return;
  const ops::DeviceInfo d = ops::device_info(be_);
  log_info("device ", d.name, ": MFU against ",
           d.peak_flops > 0 ? format_count(d.peak_flops / 1e12) + " TFLOP/s dense bf16"
                            : std::string("an unknown peak (set EASYCTX_PEAK_TFLOPS)"),
           ", model ", format_count(flops_per_token_), " FLOPs/token");
}

void StepReporter::open_metrics(int64_t start_step) {
  if (!root_) return;
  if (cfg_.logging.metrics)
    metrics_ = std::make_unique<MetricsWriter>((fs::path(cfg_.output.dir) / "metrics.jsonl").string(), start_step > 0,
                                               start_step + 1);
  if (cfg_.logging.tensorboard) {
    // A run that starts over at step 0 (killed before its first checkpoint) may find the killed
    // process's events of this run: they are dropped the same way (another run's are archived).
    const std::string dir = (fs::path(cfg_.output.dir) / "tensorboard").string();
    const bool earlier = fs::exists(dir) && !tb::list_event_files(dir).empty();
    tb_ = std::make_unique<tb::EventWriter>(dir);
    if (start_step > 0 || earlier) tb_->session_start(start_step + 1);
    log_info("TensorBoard events: ", tb_->path());
  }
}

bool StepReporter::profiling() const { return prof_ && prof_->enabled(); }

void StepReporter::begin_step(int64_t step, int64_t start_step) {
  if (prof_) prof_->set_enabled(step > start_step || cfg_.train.steps - start_step == 1);
  phase_t_ = Clock::now();
}

void StepReporter::phase(const char* name) {
  if (!profiling()) return;
  be_.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - phase_t_).count();
  phase_t_ = Clock::now();
  for (auto& [n, t] : phase_ms_)
    if (n == name) {
      t += ms;
      return;
    }
  phase_ms_.emplace_back(name, ms);
}

void StepReporter::end_step(const StepStats& st) {
  if (!profiling()) return;
  prof_->collect();
  ++profiled_steps_;
  profiled_ms_ += 1e3 * st.seconds;
}

void StepReporter::record(int64_t step, int64_t start_step, double elapsed, StepStats& st) {
  const double tps = static_cast<double>(st.tokens) / st.seconds;
  const bool device = be_.memspace() == MemSpace::Device;
  if (device) {
    peak_mem_bytes_ = std::max(peak_mem_bytes_, ops::device_memory_used(be_));
    st.peak_mem_gib = peak_mem_bytes_ / (1024.0 * 1024.0 * 1024.0);
    // Per GPU: every rank computes its share of the global batch's tokens.
    const double flops = flops_per_token_ - (1.0 - st.attention_share) * attention_flops_per_token_;
    if (peak_flops_ > 0) st.mfu = tps * flops / (peak_flops_ * static_cast<double>(world_size_));
  }
  if (metrics_ || tb_) {
    Json r = Json::object();
    r.set("step", step + 1);
    if (!st.no_labels) r.set("loss", st.loss);
    r.set("lr", st.lr);
    if (!st.no_labels) r.set("grad_norm", st.grad_norm);
    r.set("tokens", st.tokens);
    r.set("labels", st.labels);
    r.set("tokens_per_s", tps);
    r.set("fwd_bwd_s", st.fwd_bwd_seconds);
    r.set("elapsed", elapsed);
    if (st.mfu >= 0) r.set("mfu", st.mfu);
    if (st.attention_share < 1) r.set("attention_share", st.attention_share);
    if (st.peak_mem_gib >= 0) r.set("peak_mem_gib", st.peak_mem_gib);
    if (st.host_optimizer_s >= 0) {
      r.set("host_optimizer_s", st.host_optimizer_s);
      r.set("host_optimizer_exposed_s", st.host_optimizer_exposed_s);
      r.set("host_optimizer_gb_s", st.host_optimizer_gb_s);
    }
    r.set("host_peak_gib", static_cast<double>(plan::vm_hwm_bytes()) / (1024.0 * 1024.0 * 1024.0));
    if (st.skipped) r.set("skipped", true);
    if (st.no_labels) r.set("no_labels", true);
    if (metrics_) metrics_->write(r);
    if (tb_) tb_->add_scalars(step + 1, tensorboard_scalars(r));
  }
  if ((step + 1) % std::max<int64_t>(1, cfg_.logging.every) != 0 && step + 1 != cfg_.train.steps) return;
  const double done = static_cast<double>(step + 1 - start_step);
  const double eta = elapsed / done * static_cast<double>(cfg_.train.steps - step - 1);
  char line[256];
  if (st.no_labels)
    std::snprintf(line, sizeof(line), "step %lld/%lld | no labelled token: no update | lr %.3e | %s tok/s | ETA %s",
                  static_cast<long long>(step + 1), static_cast<long long>(cfg_.train.steps), st.lr,
                  format_count(tps).c_str(), format_duration(eta).c_str());
  else
    std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | ETA %s",
                  static_cast<long long>(step + 1), static_cast<long long>(cfg_.train.steps), st.loss, st.lr,
                  st.grad_norm, format_count(tps).c_str(), format_duration(eta).c_str());
  std::string extra;
  if (device) {
    char buf[96];
    if (st.mfu >= 0) std::snprintf(buf, sizeof(buf), " | MFU %.2f%%", 100.0 * st.mfu);
    else std::snprintf(buf, sizeof(buf), " | MFU n/a");
    extra += buf;
    std::snprintf(buf, sizeof(buf), " | mem %.2f GiB", st.peak_mem_gib);
    extra += buf;
  }
  if (st.host_optimizer_s > 0) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), " | host AdamW %.2f s (%.1f GB/s), %.2f s exposed", st.host_optimizer_s,
                  st.host_optimizer_gb_s, st.host_optimizer_exposed_s);
    extra += buf;
  }
  log_info(line, extra);
}

// The profile of the timed steps (rank 0's): the step's phases by wall time, then the ops by
// name and by name and shape, with their achieved TFLOP/s.
void StepReporter::report_profile() const {
  if (!prof_ || profiled_steps_ == 0 || !root_) return;
  const double n = static_cast<double>(profiled_steps_);
  std::string ph;
  for (const auto& [name, ms] : phase_ms_) ph += " | " + name + " " + format_fixed(ms / n, 1);
  log_info("profile over ", profiled_steps_,
           " step(s) (the first left out unless it was the only one; ms per "
           "step, the backend synchronized between phases): step ",
           format_fixed(profiled_ms_ / n, 1), ph);
  const std::vector<ops::OpProfileRow> rows = prof_->rows();
  const double ops_ms = prof_->total_ms();
  log_info("profile: ops of the backend ", format_fixed(ops_ms / n, 1), " ms per step (",
           format_fixed(100.0 * ops_ms / std::max(profiled_ms_, 1e-9), 1),
           "% of the step; the rest is host work, transfers, collectives and launch gaps)");
  // By op name (the key's first word), then the top keys.
  std::vector<std::pair<std::string, ops::OpProfileRow>> fam;
  for (const ops::OpProfileRow& r : rows) {
    const std::string op = r.key.substr(0, r.key.find(' '));
    auto it = std::find_if(fam.begin(), fam.end(), [&](const auto& f) { return f.first == op; });
    if (it == fam.end()) it = fam.insert(fam.end(), {op, ops::OpProfileRow{op}});
    it->second.calls += r.calls;
    it->second.ms += r.ms;
    it->second.flops += r.flops;
  }
  std::stable_sort(fam.begin(), fam.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  auto line = [&](const ops::OpProfileRow& r) {
    char buf[320];
    const double tf = r.flops > 0 && r.ms > 0 ? r.flops / (r.ms * 1e-3) / 1e12 : 0;
    std::snprintf(buf, sizeof(buf), "%10.1f %6.1f%% %9.1f %8s  %s", r.ms / n, 100.0 * r.ms / std::max(ops_ms, 1e-9),
                  static_cast<double>(r.calls) / n, tf > 0 ? format_fixed(tf, tf >= 10 ? 0 : 3).c_str() : "-",
                  r.key.c_str());
    return std::string(buf);
  };
  log_info("profile by op:   ms/step  %ops calls/step  TFLOP/s  op");
  for (const auto& f : fam) log_info("  ", line(f.second));
  log_info("profile by op and shape (top 40):");
  for (size_t i = 0; i < rows.size() && i < 40; ++i) log_info("  ", line(rows[i]));
  Json j = Json::object();
  j.set("steps", profiled_steps_);
  j.set("step_ms", profiled_ms_ / n);
  Json jp = Json::object();
  for (const auto& [name, ms] : phase_ms_) jp.set(name, ms / n);
  j.set("phases_ms", jp);
  j.set("ops_ms", ops_ms / n);
  Json jr = Json::array();
  for (const ops::OpProfileRow& r : rows) {
    Json o = Json::object();
    o.set("op", r.key);
    o.set("calls", static_cast<double>(r.calls) / n);
    o.set("ms", r.ms / n);
    if (r.flops > 0) o.set("tflops", r.flops / (r.ms * 1e-3) / 1e12);
    jr.push_back(o);
  }
  j.set("ops", jr);
  const std::string path = (fs::path(cfg_.output.dir) / "profile.json").string();
  write_file_atomic(path, j.dump() + "\n");
  log_info("profile written to ", path);
}

}  // namespace easyctx::train
