#include "eval/needle.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strings.h"
#include "core/tensorboard.h"
#include "eval/haystack.h"
#include "eval/model_source.h"

namespace easyctx::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string depth_str(double d) {
  std::ostringstream os;
  os.precision(6);
  os << d;
  return os.str();
}

std::string score_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

std::string describe_needle_options(const NeedleOptions& o) {
  const std::vector<int64_t> L = context_lengths(o);
  std::ostringstream os;
  os << "model: " << o.session.model << "\ntokenizer: " << o.tokenizer << "\noutput-dir: " << o.output_dir
     << "\nhaystack-dir: " << (o.haystack_dir.empty() ? std::string("(the King James Bible)") : o.haystack_dir)
     << "\ntasks:";
  for (const Task t : o.tasks) os << " " << task_name(t);
  os << "\ncontext lengths: " << L.size() << " (";
  if (o.context_list.empty()) {
    os << L.front() << " to " << L.back() << " step " << o.context_interval;
  } else {
    for (size_t i = 0; i < L.size(); ++i) os << (i ? ", " : "") << L[i];
  }
  os << ")\ndepths:";
  for (const double d : needle_depths(o)) os << " " << depth_str(d);
  os << "\nsamples: " << o.samples << "\ndigits: " << o.task.digits << "\ndistractors: " << o.task.distractors
     << "\nseed: " << o.seed << "\nrope-theta: " << o.session.rope_theta << "\nsp-size: " << o.session.sp_size
     << "\nsp-mode: " << to_string(o.session.sp_mode) << "\n";
  return os.str();
}

std::vector<int64_t> context_lengths(const NeedleOptions& o) {
  if (!o.context_list.empty()) return o.context_list;
  std::vector<int64_t> v;
  for (int64_t L = o.min_context; L <= o.max_context; L += o.context_interval) v.push_back(L);
  return v;
}

int64_t longest_prompt_tokens(const NeedleOptions& o, const data::Tokenizer& tok) {
  const PromptBuilder b(tok, o.task);
  constexpr int64_t kL = 256;  // a stand-in haystack length: the fixed part does not depend on it
  const std::vector<uint32_t> noise = b.noise_haystack(kL);
  int64_t fixed = 0;
  for (const Task t : o.tasks)
    for (uint64_t d = 0; d < 64; ++d) {
      Rng rng(mix_seed({o.seed, 0x706c616eull, static_cast<uint64_t>(t), d}));
      const int64_t n =
          static_cast<int64_t>((t == Task::Needle ? b.needle(noise, kL, 0.5, random_number(rng, o.task.digits), rng)
                                                  : b.synthetic(t, noise, kL, rng))
                                   .tokens.size());
      fixed = std::max(fixed, n - kL);
    }
  return context_lengths(o).back() + fixed + 16;
}

std::vector<double> needle_depths(const NeedleOptions& o) {
  // As numpy's arange(0, 1 + d, d) computes its values (k * d), without its float overshoot.
  std::vector<double> v;
  for (int k = 0;; ++k) {
    const double d = k * o.depth_interval;
    if (d > 1 + 1e-9) break;
    v.push_back(std::min(d, 1.0));
  }
  return v;
}

double SweepResult::average(Task t) const {
  double sum = 0;
  int64_t n = 0;
  for (const CellResult& c : cells)
    if (c.task == t) sum += c.score(), ++n;
  return n ? sum / static_cast<double>(n) : kNaN;
}

double SweepProgress::eta() const {
  if (work_done <= 0 || seconds <= 0) return -1;
  return seconds * (work_total - work_done) / work_done;
}

std::string format_sweep_progress(const SweepProgress& p) {
  const double eta = p.eta();
  return detail::concat(
      "cells ", p.cells_done, "/", p.cells_total, ", prompts ", p.prompts_done, "/", p.prompts_total, ", ",
      format_count(static_cast<double>(p.tokens)), " tokens, ",
      format_count(p.seconds > 0 ? static_cast<double>(p.tokens) / p.seconds : 0.0), " tok/s, elapsed ",
      format_duration(p.seconds),
      p.cells_done < p.cells_total ? ", ETA " + (eta >= 0 ? format_duration(eta) : std::string("?")) : std::string());
}

SweepProgressFn log_sweep_progress(int rank, double every_s) {
  auto last = std::make_shared<double>(0.0);
  return [rank, every_s, last](const SweepProgress& p, const std::vector<CellResult>& finished) {
    if (rank != 0) return;
    if (finished.empty()) {  // inside a call
      if (p.seconds - *last < every_s) return;
      *last = p.seconds;
      log_info("eval needle: ", format_sweep_progress(p));
      return;
    }
    *last = p.seconds;
    // One line per task and length: its cells' scores.
    std::string line;
    for (size_t i = 0; i < finished.size(); ++i) {
      const CellResult& c = finished[i];
      const bool first = i == 0 || finished[i - 1].task != c.task || finished[i - 1].context != c.context;
      if (first) {
        if (!line.empty()) log_info(line);
        line = std::string(task_name(c.task)) + " L=" + std::to_string(c.context) + ":";
      }
      if (c.task == Task::Needle) line += (first ? " depth " : ", ") + depth_str(c.depth) + " ";
      else line += " ";
      line += std::to_string(c.correct) + "/" + std::to_string(c.samples);
    }
    if (!line.empty()) log_info(line);
    log_info("eval needle: ", format_sweep_progress(p));
  };
}

std::vector<Prompt> cell_prompts(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack,
                                 const std::vector<uint32_t>& noise, Task t, int64_t L, size_t depth_index) {
  std::vector<Prompt> out;
  if (t == Task::Needle) {
    const std::vector<double> depths = needle_depths(o);
    EASYCTX_CHECK(depth_index < depths.size(), "needle cell: depth index ", depth_index, " of ", depths.size());
    // EasyContext draws the needles' numbers once: every cell asks for the same ones.
    Rng numbers_rng(mix_seed({o.seed, 0x6e6565646c65ull}));
    for (int k = 0; k < o.samples; ++k) {
      const int64_t number = random_number(numbers_rng, o.task.digits);
      Rng rng(mix_seed(
          {o.seed, static_cast<uint64_t>(t), static_cast<uint64_t>(L), depth_index, static_cast<uint64_t>(k)}));
      out.push_back(b.needle(haystack, L, depths[depth_index], number, rng));
    }
  } else {
    for (int k = 0; k < o.samples; ++k) {
      Rng rng(mix_seed(
          {o.seed, static_cast<uint64_t>(t), static_cast<uint64_t>(L), uint64_t{0}, static_cast<uint64_t>(k)}));
      out.push_back(b.synthetic(t, noise, L, rng));
    }
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// A cell of one context length: a task, and for the needle a depth.
struct PlannedCell {
  Task task;
  size_t depth_index;
};

// The cells of one length, in --task order (depths in order for the needle).
std::vector<PlannedCell> cells_per_length(const NeedleOptions& o, const std::vector<double>& depths) {
  std::vector<PlannedCell> per_length;
  for (Task t : o.tasks) {
    if (t == Task::Needle) {
      for (size_t d = 0; d < depths.size(); ++d) per_length.push_back({t, d});
    } else {
      per_length.push_back({t, 0});
    }
  }
  return per_length;
}

// What one call of the session scores: its cells (not yet scored) and their prompts, in order.
struct SweepCall {
  std::vector<CellResult> cells;
  std::vector<ScoreRequest> reqs;
};

// The next call's cells of length L, from per_length[next] on (advancing `next`): at least one,
// then as many as keep the call's prompts to about kCallTokens tokens (on every rank); a
// length's cells take several calls beyond it.
SweepCall next_call(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack,
                    const std::vector<uint32_t>& noise, const std::vector<double>& depths,
                    const std::vector<PlannedCell>& per_length, int64_t L, size_t& next) {
  constexpr int64_t kCallTokens = int64_t{1} << 26;
  SweepCall call;
  int64_t call_tokens = 0;
  while (next < per_length.size() && (call.cells.empty() || call_tokens + L * o.samples <= kCallTokens)) {
    const PlannedCell& p = per_length[next++];
    CellResult c;
    c.task = p.task;
    c.context = L;
    c.depth = p.task == Task::Needle ? depths[p.depth_index] : kNaN;
    for (Prompt& pr : cell_prompts(o, b, haystack, noise, p.task, L, p.depth_index)) {
      c.tokens += static_cast<int64_t>(pr.tokens.size());
      ScoreRequest q;
      q.spans.push_back({pr.answer_begin - 1, pr.answer_length});
      q.tokens = std::move(pr.tokens);
      call.reqs.push_back(std::move(q));
    }
    call_tokens += c.tokens;
    call.cells.push_back(c);
  }
  return call;
}

// Scores a call's prompts; with a relay, the session's rounds reach `progress` as sweep progress
// on from `before` (the call being `call_work` of the sweep's work).
std::vector<std::vector<SpanScore>> score_call(Session& s, const std::vector<ScoreRequest>& reqs,
                                               const SweepProgressFn& progress, const SweepRelay* relay,
                                               const SweepProgress& before, double call_work, Clock::time_point t0) {
  if (relay && progress)
    *relay->target = [&](const ScoreProgress& sp) {
      SweepProgress now = before;
      now.prompts_done += sp.items_done;
      now.tokens += sp.tokens_done;
      if (sp.tokens_total > 0)
        now.work_done += call_work * static_cast<double>(sp.tokens_done) / static_cast<double>(sp.tokens_total);
      now.seconds = seconds_since(t0);
      if (sp.items_done < sp.items_total) progress(now, {});
    };
  std::vector<std::vector<SpanScore>> scores;
  try {
    scores = s.score_spans(reqs);
  } catch (...) {
    if (relay) *relay->target = nullptr;
    throw;
  }
  if (relay) *relay->target = nullptr;
  EASYCTX_CHECK(scores.size() == reqs.size(), "needle sweep: the session returned ", scores.size(), " results for ",
                reqs.size(), " prompts");
  return scores;
}

// Each cell's share of `scores` (o.samples prompts a cell, in order) added to it; the cells go to r.
void tally_call(std::vector<CellResult>& cells, const std::vector<std::vector<SpanScore>>& scores, int samples,
                SweepResult& r) {
  size_t q = 0;
  for (CellResult& c : cells) {
    for (int k = 0; k < samples; ++k, ++q) {
      EASYCTX_CHECK(scores[q].size() == 1, "needle sweep: the session returned ", scores[q].size(),
                    " span scores for one span");
      const SpanScore& sc = scores[q][0];
      c.correct += sc.all_argmax ? 1 : 0;
      c.answer_nll += sc.sum_nll;
      c.answer_tokens += sc.count;
      ++c.samples;
    }
    r.tokens += c.tokens;
    r.cells.push_back(c);
  }
}

}  // namespace

SweepResult run_sweep(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack, Session& s,
                      const SweepProgressFn& progress, const SweepRelay* relay) {
  check_needle_options(o);
  const std::vector<int64_t> lengths = context_lengths(o);
  const std::vector<double> depths = needle_depths(o);
  const bool needle = std::find(o.tasks.begin(), o.tasks.end(), Task::Needle) != o.tasks.end();
  const bool synthetic = std::any_of(o.tasks.begin(), o.tasks.end(), is_synthetic);
  const std::vector<uint32_t> noise = synthetic ? b.noise_haystack(o.max_context) : std::vector<uint32_t>{};
  if (needle)
    EASYCTX_CHECK(static_cast<int64_t>(haystack.size()) >= o.max_context, "needle sweep: a haystack of ",
                  haystack.size(), " tokens for --max-context-length ", o.max_context);
  const std::vector<PlannedCell> per_length = cells_per_length(o, depths);
  SweepProgress prog;
  prog.cells_total = static_cast<int64_t>(per_length.size() * lengths.size());
  prog.prompts_total = prog.cells_total * o.samples;
  for (int64_t L : lengths)
    prog.work_total += static_cast<double>(L) * static_cast<double>(per_length.size() * o.samples);

  SweepResult r;
  const auto t0 = Clock::now();
  for (int64_t L : lengths) {
    size_t next = 0;
    while (next < per_length.size()) {
      SweepCall call = next_call(o, b, haystack, noise, depths, per_length, L, next);
      const double call_work = static_cast<double>(L) * static_cast<double>(call.reqs.size());
      const std::vector<std::vector<SpanScore>> scores = score_call(s, call.reqs, progress, relay, prog, call_work, t0);
      tally_call(call.cells, scores, o.samples, r);
      prog.cells_done += static_cast<int64_t>(call.cells.size());
      prog.prompts_done += static_cast<int64_t>(call.reqs.size());
      prog.tokens = r.tokens;
      prog.work_done += call_work;
      prog.seconds = seconds_since(t0);
      if (progress) progress(prog, call.cells);
    }
  }
  // By task (in --task order), then context, then depth.
  auto task_rank = [&](Task t) { return std::find(o.tasks.begin(), o.tasks.end(), t) - o.tasks.begin(); };
  std::stable_sort(r.cells.begin(), r.cells.end(),
                   [&](const CellResult& a, const CellResult& c) { return task_rank(a.task) < task_rank(c.task); });
  r.seconds = seconds_since(t0);
  return r;
}

std::string needle_csv(const SweepResult& r) {
  std::string s = "context,depth,score,samples\n";
  for (const CellResult& c : r.cells)
    if (c.task == Task::Needle)
      s += std::to_string(c.context) + "," + depth_str(c.depth) + "," + score_str(c.score()) + "," +
           std::to_string(c.samples) + "\n";
  return s;
}

std::string synthetic_csv(const SweepResult& r) {
  std::string s = "task,context,score,samples\n";
  for (const CellResult& c : r.cells)
    if (is_synthetic(c.task))
      s += std::string(task_name(c.task)) + "," + std::to_string(c.context) + "," + score_str(c.score()) + "," +
           std::to_string(c.samples) + "\n";
  return s;
}

HeatmapImage needle_heatmap(const SweepResult& r, const std::string& title) {
  std::set<int64_t> ctx;
  std::set<double> dep;
  for (const CellResult& c : r.cells)
    if (c.task == Task::Needle) ctx.insert(c.context), dep.insert(c.depth);
  HeatmapImage h;
  h.title = title;
  h.x_label = "Token Limit";
  h.y_label = "Depth Percent";
  const std::vector<int64_t> cs(ctx.begin(), ctx.end());
  const std::vector<double> ds(dep.begin(), dep.end());
  for (int64_t x : cs) h.x_ticks.push_back(std::to_string(x));
  for (double d : ds) h.y_ticks.push_back(depth_str(std::round(d * 1000) / 10));
  h.value.assign(ds.size(), std::vector<double>(cs.size(), kNaN));
  for (const CellResult& c : r.cells)
    if (c.task == Task::Needle) {
      const size_t row = static_cast<size_t>(std::lower_bound(ds.begin(), ds.end(), c.depth) - ds.begin());
      const size_t col = static_cast<size_t>(std::lower_bound(cs.begin(), cs.end(), c.context) - cs.begin());
      h.value[row][col] = c.score();
    }
  return h;
}

HeatmapImage synthetic_heatmap(const SweepResult& r, const std::string& title) {
  std::vector<Task> tasks;
  std::set<int64_t> ctx;
  for (const CellResult& c : r.cells)
    if (is_synthetic(c.task)) {
      if (std::find(tasks.begin(), tasks.end(), c.task) == tasks.end()) tasks.push_back(c.task);
      ctx.insert(c.context);
    }
  HeatmapImage h;
  h.title = title;
  h.x_label = "Token Limit";
  h.y_label = "Task";
  const std::vector<int64_t> cs(ctx.begin(), ctx.end());
  for (int64_t x : cs) h.x_ticks.push_back(std::to_string(x));
  for (Task t : tasks) h.y_ticks.push_back(task_name(t));
  h.value.assign(tasks.size(), std::vector<double>(cs.size(), kNaN));
  for (const CellResult& c : r.cells)
    if (is_synthetic(c.task)) {
      const size_t row = static_cast<size_t>(std::find(tasks.begin(), tasks.end(), c.task) - tasks.begin());
      const size_t col = static_cast<size_t>(std::lower_bound(cs.begin(), cs.end(), c.context) - cs.begin());
      h.value[row][col] = c.score();
    }
  return h;
}

std::string write_needle_events(const std::string& dir, const std::string& label, const SweepResult& r,
                                const std::vector<Task>& tasks) {
  std::set<int64_t> contexts;
  for (const CellResult& c : r.cells) contexts.insert(c.context);
  tb::EventWriter w(dir);
  for (int64_t ctx : contexts) {
    std::vector<tb::Scalar> values;
    for (Task t : tasks) {
      double sum = 0;
      int64_t n = 0;
      std::vector<tb::Scalar> depths;
      for (const CellResult& c : r.cells) {
        if (c.task != t || c.context != ctx) continue;
        sum += c.score();
        ++n;
        if (t == Task::Needle)
          depths.emplace_back("eval_needle/" + label + "/needle_depth_" + depth_str(std::round(c.depth * 1000) / 10),
                              static_cast<float>(c.score()));
      }
      if (n == 0) continue;
      values.emplace_back("eval_needle/" + label + "/" + task_name(t),
                          static_cast<float>(sum / static_cast<double>(n)));
      values.insert(values.end(), depths.begin(), depths.end());
    }
    w.add_scalars(ctx, values);
  }
  return w.path();
}

void write_needle_outputs(const NeedleOptions& o, const SweepResult& r, const std::string& session_description,
                          const std::string& haystack_description) {
  std::error_code ec;
  std::filesystem::create_directories(o.output_dir, ec);
  EASYCTX_CHECK_INPUT(!ec, "--output-dir ", o.output_dir, ": cannot create it: ", ec.message());
  const std::string model = std::filesystem::path(o.session.model).filename().string();
  auto avg = [&](Task t) { return score_str(r.average(t)); };
  const bool needle = std::find(o.tasks.begin(), o.tasks.end(), Task::Needle) != o.tasks.end();
  const bool synthetic = std::any_of(o.tasks.begin(), o.tasks.end(), is_synthetic);
  if (needle) {
    write_file_atomic(o.output_dir + "/needle.csv", needle_csv(r));
    write_png(o.output_dir + "/needle.png",
              draw_heatmap(needle_heatmap(r, "Needle in a haystack: " + model + ", average " + avg(Task::Needle))));
  }
  if (synthetic) {
    std::string t = "Synthetic retrieval: " + model + ", average";
    for (Task k : o.tasks)
      if (is_synthetic(k)) t += std::string(" ") + task_name(k) + " " + avg(k);
    write_file_atomic(o.output_dir + "/synthetic.csv", synthetic_csv(r));
    write_png(o.output_dir + "/synthetic.png", draw_heatmap(synthetic_heatmap(r, t)));
  }
  Json j = Json::object({{"model", o.session.model},
                         {"session", session_description},
                         {"tokenizer", o.tokenizer},
                         {"haystack", haystack_description}});
  Json tasks = Json::object();
  for (Task k : o.tasks) {
    Json t = Json::object();
    int64_t cells = 0;
    for (const CellResult& c : r.cells) cells += c.task == k;
    const double a = r.average(k);
    t.set("average", std::isfinite(a) ? Json(a) : Json());
    t.set("cells", cells);
    double nll = 0;
    int64_t answer_tokens = 0;
    for (const CellResult& c : r.cells)
      if (c.task == k) nll += c.answer_nll, answer_tokens += c.answer_tokens;
    t.set("answer_nll", answer_tokens ? Json(nll / static_cast<double>(answer_tokens)) : Json());
    tasks.set(task_name(k), t);
  }
  j.set("tasks", tasks);
  j.set("tokens", r.tokens);
  j.set("seconds", r.seconds);
  j.set("tokens_per_s", r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0);
  j.set("options", Json::object({{"min_context_length", o.min_context},
                                 {"max_context_length", o.max_context},
                                 {"context_interval", o.context_interval},
                                 {"context_lengths", Json::array_of(context_lengths(o))},
                                 {"depth_interval", o.depth_interval},
                                 {"samples", o.samples},
                                 {"seed", o.seed},
                                 {"digits", o.task.digits},
                                 {"distractors", o.task.distractors},
                                 {"keys", o.task.keys},
                                 {"values", o.task.values},
                                 {"hops", o.task.hops},
                                 {"rope_theta", o.session.rope_theta}}));
  write_file_atomic(o.output_dir + "/summary.json", j.dump(2) + "\n");
  if (o.tensorboard != "none") {
    const std::string dir = o.tensorboard.empty() ? o.output_dir + "/tensorboard" : o.tensorboard;
    const std::string label = o.session.resolved ? o.session.resolved->label() : model;
    log_info("TensorBoard events: ", write_needle_events(dir, label, r, o.tasks));
  }
}

SweepResult run_needle(const NeedleOptions& o, dist::Comm& world, const Haystack* haystack) {
  check_needle_options(o);
  SweepRelay relay;
  SessionOptions so = o.session;
  so.progress = relay.callback();
  const std::unique_ptr<Session> s = open_session(so, world);
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(o.tokenizer);
  EASYCTX_CHECK_INPUT(tok->vocab_size() <= s->vocab_size(), "--tokenizer ", o.tokenizer, " has ", tok->vocab_size(),
                      " ids, more than the vocabulary of --model ", o.session.model, " (", s->vocab_size(), ")");
  EASYCTX_CHECK_INPUT(tok->bos_id() < 0 || s->bos_id() < 0 || tok->bos_id() == s->bos_id(), "--tokenizer ", o.tokenizer,
                      " has BOS id ", tok->bos_id(), ", --model ", o.session.model, " has ", s->bos_id(),
                      ": not the model's tokenizer");
  const PromptBuilder b(*tok, o.task);
  const bool needle = std::find(o.tasks.begin(), o.tasks.end(), Task::Needle) != o.tasks.end();
  Haystack loaded;
  if (needle && !haystack) loaded = load_haystack(o.haystack_dir, *tok, o.max_context, world);
  const Haystack& hay = haystack ? *haystack : loaded;
  std::string tasks;
  for (Task t : o.tasks) tasks += (tasks.empty() ? "" : ",") + std::string(task_name(t));
  log_info("eval needle: ", s->describe(), "; tasks ", tasks, "; lengths ", o.min_context, "..", o.max_context,
           o.context_list.empty() ? " step " + std::to_string(o.context_interval)
                                  : " (" + std::to_string(o.context_list.size()) + " listed)",
           ", ", o.samples, " sample(s) per cell", needle ? "; haystack " + hay.description : "");
  const SweepResult r = run_sweep(o, b, hay.tokens, *s, log_sweep_progress(world.rank(), o.progress_every), &relay);
  if (world.rank() == 0) write_needle_outputs(o, r, s->describe(), needle ? hay.description : "");
  std::string avgs;
  for (Task t : o.tasks) avgs += std::string(avgs.empty() ? "" : ", ") + task_name(t) + " " + score_str(r.average(t));
  log_info("eval needle summary: ", r.cells.size(), " cells, average accuracy ", avgs, "; ",
           format_count(static_cast<double>(r.tokens)), " tokens in ", format_duration(r.seconds), " (",
           format_count(r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0), " tok/s) on ", s->describe(),
           "; wrote ", o.output_dir);
  return r;
}

}  // namespace easyctx::eval
