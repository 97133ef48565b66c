#include "report/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "report/svg.h"

namespace easyctx::report {
namespace fs = std::filesystem;
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// The [row][context] scores of an eval CSV's cells (NaN where a cell is absent), for the
// rows and contexts given: a needle grid's depths, a synthetic grid's tasks.
template <class Row>
std::vector<std::vector<double>> score_rows(const std::map<std::pair<Row, int64_t>, double>& cell,
                                            const std::vector<Row>& rows, const std::vector<int64_t>& contexts) {
  std::vector<std::vector<double>> score;
  for (const Row& r : rows) {
    std::vector<double> row;
    for (int64_t c : contexts) {
      auto it = cell.find({r, c});
      row.push_back(it == cell.end() ? kNaN : it->second);
    }
    score.push_back(row);
  }
  return score;
}

double num(const Json& r, const char* key) {
  const Json* v = r.find(key);
  return v && v->is_number() ? v->as_double() : kNaN;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The CSV files of a folder and its eval/ subfolder, by their header line.
void read_evals(const fs::path& dir, StageRun& s) {
  for (const fs::path& d : {dir, dir / "eval"}) {
    if (!fs::is_directory(d)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_regular_file() && e.path().extension() == ".csv") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      const std::vector<std::string> lines = split(read_file(f.string()), '\n');
      if (lines.empty()) continue;
      const std::string header = trim(lines[0]);
      auto cells = [&](size_t i) { return split(trim(lines[i]), ','); };
      if (header == "tokens,ppl,documents,nll") {
        PplCurve c{f.filename().string(), {}, {}};
        for (size_t i = 1; i < lines.size(); ++i) {
          const auto v = cells(i);
          if (v.size() < 2) continue;
          c.tokens.push_back(std::stod(v[0]));
          c.ppl.push_back(v[1] == "nan" ? kNaN : std::stod(v[1]));
        }
        s.ppl.push_back(c);
      } else if (header.rfind("context,depth,score", 0) == 0) {
        NeedleGrid g;
        g.name = f.filename().string();
        std::map<std::pair<double, int64_t>, double> cell;
        std::set<int64_t> ctx;
        std::set<double> dep;
        for (size_t i = 1; i < lines.size(); ++i) {
          const auto v = cells(i);
          if (v.size() < 3) continue;
          const int64_t c = std::stoll(v[0]);
          const double d = std::stod(v[1]);
          cell[{d, c}] = std::stod(v[2]);
          ctx.insert(c), dep.insert(d);
        }
        g.contexts.assign(ctx.begin(), ctx.end());
        g.depths.assign(dep.begin(), dep.end());
        g.score = score_rows(cell, g.depths, g.contexts);
        s.needle.push_back(g);
      } else if (header.rfind("task,context,score", 0) == 0) {
        SyntheticGrid g;
        g.name = f.filename().string();
        std::map<std::pair<std::string, int64_t>, double> cell;
        std::set<int64_t> ctx;
        for (size_t i = 1; i < lines.size(); ++i) {
          const auto v = cells(i);
          if (v.size() < 3) continue;
          const int64_t c = std::stoll(v[1]);
          cell[{v[0], c}] = std::stod(v[2]);
          ctx.insert(c);
          if (std::find(g.tasks.begin(), g.tasks.end(), v[0]) == g.tasks.end()) g.tasks.push_back(v[0]);
        }
        g.contexts.assign(ctx.begin(), ctx.end());
        g.score = score_rows(cell, g.tasks, g.contexts);
        s.synthetic.push_back(g);
      }
    }
  }
}

std::string stage_label(const StageRun& s) { return s.name; }

Json finite_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(); }

// An eval grid in the page's data: file, its row labels under row_key, contexts, score.
template <class Row>
Json grid_json(const std::string& file, const char* row_key, const std::vector<Row>& rows,
               const std::vector<int64_t>& contexts, const std::vector<std::vector<double>>& score) {
  Json n = Json::object(), r = Json::array(), c = Json::array(), sc = Json::array();
  n.set("file", file);
  for (const Row& x : rows) r.push_back(x);
  for (int64_t x : contexts) c.push_back(x);
  for (const auto& row : score) {
    Json v = Json::array();
    for (double x : row) v.push_back(finite_or_null(x));
    sc.push_back(v);
  }
  n.set("contexts", c);
  n.set(row_key, r);
  n.set("score", sc);
  return n;
}

// plan.json is plan::plan_to_json's object (lib/plan/plan_report.cpp owns its form); these
// read the parts the page shows, NaN or "" where an older plan.json lacks them.
double plan_bytes(const Json& plan, const char* part, const char* key) {
  const Json* p = plan.find(part);
  const Json* v = p ? p->find(key) : nullptr;
  return v && v->is_number() ? v->as_double() : kNaN;
}
std::string plan_str(const Json& plan, const char* part, const char* key) {
  const Json* p = plan.find(part);
  const Json* v = p ? p->find(key) : nullptr;
  return v && v->is_string() ? v->as_string() : "";
}
double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// A plan of a CPU run (target.backend cpu; an older plan.json: no GPU named): it has no GPU
// figures, only host ones.
bool cpu_plan(const Json& plan) {
  const std::string backend = plan_str(plan, "target", "backend");
  return backend.empty() ? plan_str(plan, "target", "gpu").empty() : backend == "cpu";
}

// "parallel.zero.stage 3, parallel.zero.offload_optimizer true, ..." from the plan's settings.
std::string plan_settings(const Json& plan) {
  const Json* st = plan.find("settings");
  if (!st || !st->is_object()) return "";
  std::string out;
  for (const auto& [k, v] : st->as_object())
    out += (out.empty() ? "" : ", ") + k + " " + (v.is_string() ? v.as_string() : v.dump());
  return out;
}

// "context 3.60 + model state 7.12 + ..." of a by_category object.
std::string categories(const Json& plan, const char* part) {
  const Json* p = plan.find(part);
  const Json* c = p ? p->find("by_category") : nullptr;
  if (!c || !c->is_object()) return "";
  std::string out;
  for (const auto& [k, v] : c->as_object())
    if (v.is_number() && v.as_double() > 0) out += (out.empty() ? "" : " + ") + k + " " + fixed(gib(v.as_double()), 2);
  return out;
}

}  // namespace

StageRun read_stage(const std::string& dir) {
  const fs::path d(dir);
  EASYCTX_CHECK_INPUT(fs::is_directory(d), "easyctx_report: ", dir, " is not a folder (give a run's output.dir)");
  StageRun s;
  s.dir = dir;
  s.name = d.filename().empty() ? d.parent_path().filename().string() : d.filename().string();
  const fs::path m = d / "metrics.jsonl";
  if (fs::exists(m)) {
    int line = 0;
    for (const std::string& l : split(read_file(m.string()), '\n')) {
      ++line;
      if (trim(l).empty()) continue;
      s.metrics.push_back(parse_json(l, m.string() + ":" + std::to_string(line)));
    }
  }
  for (size_t i = 1; i < s.metrics.size(); ++i)
    if (num(s.metrics[i], "elapsed") < num(s.metrics[i - 1], "elapsed")) s.restarts.push_back(i);
  if (fs::exists(d / "plan.json"))
    s.plan = parse_json(read_file((d / "plan.json").string()), (d / "plan.json").string());
  if (fs::exists(d / "run.json")) s.run = parse_json(read_file((d / "run.json").string()), (d / "run.json").string());
  s.done = fs::exists(d / "DONE");
  read_evals(d, s);
  EASYCTX_CHECK_INPUT(
      !s.metrics.empty() || !s.plan.is_null() || !s.ppl.empty() || !s.needle.empty() || !s.synthetic.empty(),
      "easyctx_report: ", dir,
      " holds no metrics.jsonl, plan.json or evaluation CSV (a run's "
      "output.dir is expected)");
  return s;
}

Json report_data(const std::vector<StageRun>& stages) {
  Json out = Json::object();
  Json js = Json::array();
  int64_t offset = 0;
  for (const StageRun& s : stages) {
    Json o = Json::object();
    o.set("name", s.name);
    o.set("dir", s.dir);
    o.set("done", s.done);
    o.set("first_global_step", offset);
    Json steps = Json::array(), loss = Json::array();
    for (const Json& r : s.metrics) {
      steps.push_back(static_cast<int64_t>(num(r, "step")));
      loss.push_back(finite_or_null(num(r, "loss")));
    }
    o.set("steps", steps);
    o.set("loss", loss);
    Json rs = Json::array();
    for (size_t i : s.restarts) rs.push_back(static_cast<int64_t>(num(s.metrics[i], "step")));
    o.set("restarts_at_step", rs);
    if (!s.plan.is_null()) {
      o.set("plan_fits", s.plan.find("fits") ? *s.plan.find("fits") : Json());
      Json pl = Json::object();
      pl.set("gpu_device_total_bytes", finite_or_null(plan_bytes(s.plan, "gpu", "device_total_bytes")));
      pl.set("host_per_node_peak_bytes", finite_or_null(plan_bytes(s.plan, "host", "per_node_peak_bytes")));
      pl.set("settings", s.plan.find("settings") ? *s.plan.find("settings") : Json());
      o.set("plan", pl);
    }
    Json ppl = Json::array();
    for (const PplCurve& c : s.ppl) {
      Json p = Json::object();
      p.set("file", c.name);
      Json t = Json::array(), v = Json::array();
      for (size_t i = 0; i < c.tokens.size(); ++i) t.push_back(c.tokens[i]), v.push_back(finite_or_null(c.ppl[i]));
      p.set("tokens", t);
      p.set("ppl", v);
      ppl.push_back(p);
    }
    o.set("ppl", ppl);
    Json needle = Json::array(), synthetic = Json::array();
    for (const NeedleGrid& g : s.needle) needle.push_back(grid_json(g.name, "depths", g.depths, g.contexts, g.score));
    for (const SyntheticGrid& g : s.synthetic)
      synthetic.push_back(grid_json(g.name, "tasks", g.tasks, g.contexts, g.score));
    o.set("needle", needle);
    o.set("synthetic", synthetic);
    js.push_back(o);
    if (!s.metrics.empty()) offset += static_cast<int64_t>(num(s.metrics.back(), "step"));
  }
  out.set("stages", js);
  return out;
}

namespace {

// The page head: title and style sheet.
void write_head(std::ostream& o, const std::string& title) {
  o << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << html_escape(title)
    << "</title>\n<style>\n"
       "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}\n"
       "h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}\n"
       "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
       "th{background:#f3f3f3}td.l,th.l{text-align:left}\n"
       ".chart .frame{fill:none;stroke:#999}.chart .grid{stroke:#eee}.title{font-size:13px;font-weight:600}\n"
       ".tick{font-size:10px;fill:#555}.axis{font-size:11px;fill:#333}.legend{font-size:11px}.marker{font-size:10px}\n"
       ".note{color:#666;font-size:12px}svg{display:block;margin:12px 0}\n"
       "</style></head><body>\n";
  o << "<h1>" << html_escape(title) << "</h1>\n";
}

// One row a stage: steps, restarts, last loss, throughput, memory, plan, status.
void write_stage_table(std::ostream& o, const std::vector<StageRun>& stages) {
  o << "<h2>Stages</h2>\n<table><tr><th class=\"l\">stage</th><th>steps</th><th>restarts</th><th>last loss</th>"
       "<th>median tokens/s</th><th>median MFU</th><th>peak memory (GiB)</th><th>plan peak per GPU (GiB)</th>"
       "<th>plan host per node (GiB)</th><th class=\"l\">status</th></tr>\n";
  for (const StageRun& s : stages) {
    std::vector<double> tps, mfu;
    double mem = kNaN;
    for (const Json& r : s.metrics) {
      if (std::isfinite(num(r, "tokens_per_s"))) tps.push_back(num(r, "tokens_per_s"));
      if (std::isfinite(num(r, "mfu"))) mfu.push_back(num(r, "mfu"));
      if (std::isfinite(num(r, "peak_mem_gib")))
        mem = std::isfinite(mem) ? std::max(mem, num(r, "peak_mem_gib")) : num(r, "peak_mem_gib");
    }
    auto median = [](std::vector<double> v) {
      if (v.empty()) return kNaN;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const std::string plan_gpu = s.plan.is_null()   ? "-"
                                 : cpu_plan(s.plan) ? "n/a (CPU run)"
                                                    : fixed(gib(plan_bytes(s.plan, "gpu", "device_total_bytes")), 2);
    const double plan_host = gib(plan_bytes(s.plan, "host", "per_node_peak_bytes"));
    o << "<tr><td class=\"l\">" << html_escape(s.name) << "</td><td>"
      << (s.metrics.empty() ? std::string("0") : fixed(num(s.metrics.back(), "step"), 0)) << "</td><td>"
      << s.restarts.size() << "</td><td>" << (s.metrics.empty() ? "-" : fixed(num(s.metrics.back(), "loss"), 4))
      << "</td><td>" << fixed(median(tps), 0) << "</td><td>" << (mfu.empty() ? "-" : fixed(100 * median(mfu), 1) + "%")
      << "</td><td>" << fixed(mem, 2) << "</td><td>" << plan_gpu << "</td><td>" << fixed(plan_host, 2)
      << "</td><td class=\"l\">" << (s.done ? "done" : "not finished") << "</td></tr>\n";
  }
  o << "</table>\n";
}

// Per-step charts over the chain.
void write_training_charts(std::ostream& o, const std::vector<StageRun>& stages) {
  struct Metric {
    const char* key;
    const char* title;
    const char* unit;
    bool log;
  };
  const Metric metrics[] = {{"loss", "Loss", "nats", false},
                            {"lr", "Learning rate", "lr", false},
                            {"tokens_per_s", "Tokens per second", "tokens/s", false},
                            {"mfu", "MFU", "fraction of peak", false},
                            {"peak_mem_gib", "Device memory (high-water mark)", "GiB", false},
                            {"grad_norm", "Gradient norm (before clipping)", "norm", true}};
  o << "<h2>Training</h2>\n<p class=\"note\">Global step across the stages; dashed lines: stage boundaries "
       "(grey) and restarts after a stop (red); a label with no room is left out (its line's tooltip "
       "names it).</p>\n";
  for (const Metric& m : metrics) {
    LineChart c;
    c.title = m.title;
    c.x_label = "global step";
    c.integer_x = true;
    c.y_label = m.unit;
    c.log_y = m.log;
    int64_t offset = 0;
    bool any = false;
    for (const StageRun& s : stages) {
      Series sr;
      sr.name = stage_label(s);
      for (const Json& r : s.metrics) {
        sr.x.push_back(static_cast<double>(offset) + num(r, "step"));
        sr.y.push_back(num(r, m.key));
        any |= std::isfinite(num(r, m.key));
      }
      if (offset > 0) c.markers.push_back({static_cast<double>(offset), s.name});
      for (size_t i : s.restarts)
        c.markers.push_back({static_cast<double>(offset) + num(s.metrics[i], "step"), "restart", "#d62728"});
      c.series.push_back(sr);
      if (!s.metrics.empty()) offset += static_cast<int64_t>(num(s.metrics.back(), "step"));
    }
    if (any) o << svg_line_chart(c) << "\n";
  }
}

// The memory plans (no heading when no stage has one).
void write_memory_plans(std::ostream& o, const std::vector<StageRun>& stages) {
  bool plans = false;
  for (const StageRun& s : stages) plans |= !s.plan.is_null();
  if (plans) o << "<h2>Memory plans</h2>\n";
  for (const StageRun& s : stages) {
    if (s.plan.is_null()) continue;
    const Json& pl = s.plan;
    const std::string gpu = plan_str(pl, "target", "gpu");
    const bool cpu = cpu_plan(pl);
    const double gpus = plan_bytes(pl, "target", "gpus_per_node"), nodes = plan_bytes(pl, "target", "nodes");
    o << "<p><b>" << html_escape(s.name)
      << "</b>: " << (pl.find("fits") && pl.at("fits").as_bool() ? "fits" : "does not fit") << " on " << fixed(nodes, 0)
      << " x " << fixed(gpus, 0) << " " << html_escape(cpu || gpu.empty() ? "CPU rank(s)" : gpu) << " (host "
      << fixed(gib(plan_bytes(pl, "target", "host_memory_bytes")), 0) << " GiB per node)";
    if (!cpu)
      o << "; per GPU " << fixed(gib(plan_bytes(pl, "gpu", "device_total_bytes")), 2) << " GiB at "
        << html_escape(plan_str(pl, "gpu", "peak_phase")) << " (" << html_escape(categories(pl, "gpu")) << ")";
    o << "; host per node " << fixed(gib(plan_bytes(pl, "host", "per_node_peak_bytes")), 2) << " GiB at "
      << html_escape(plan_str(pl, "host", "peak_phase")) << " (rank 0: " << html_escape(categories(pl, "host"))
      << ")</p>\n";
    const std::string knobs = plan_settings(pl);
    if (!knobs.empty()) o << "<p class=\"note\">" << html_escape(knobs) << "</p>\n";
    // (a CPU run's allocations are host memory, counted in its host columns; it has no device)
    o << "<table><tr><th class=\"l\">phase</th><th>allocations (GiB)</th>" << (cpu ? "" : "<th>device total (GiB)</th>")
      << "<th>host per rank (GiB)</th><th>host per node (GiB)</th></tr>\n";
    if (const Json* ph = pl.find("phases"))
      for (const Json& p : ph->as_array())
        o << "<tr><td class=\"l\">" << html_escape(p.at("name").as_string()) << "</td><td>"
          << fixed(gib(num(p, "allocations_bytes")), 2) << "</td><td>"
          << (cpu ? "" : fixed(gib(num(p, "gpu_bytes")), 2) + "</td><td>") << fixed(gib(num(p, "host_bytes")), 2)
          << "</td><td>" << fixed(gib(num(p, "host_node_bytes")), 2) << "</td></tr>\n";
    o << "</table>\n";
  }
}

// Evaluations: perplexity curves and retrieval heatmaps (no heading when there are none).
void write_evaluations(std::ostream& o, const std::vector<StageRun>& stages) {
  bool evals = false;
  for (const StageRun& s : stages) evals |= !s.ppl.empty() || !s.needle.empty() || !s.synthetic.empty();
  if (evals) {
    o << "<h2>Evaluations</h2>\n";
    LineChart c;
    c.title = "Perplexity by context length";
    c.x_label = "tokens";
    c.y_label = "perplexity";
    c.log_y = true;
    for (const StageRun& s : stages)
      for (const PplCurve& p : s.ppl) c.series.push_back({s.name + ": " + p.name, p.tokens, p.ppl, ""});
    if (!c.series.empty()) o << svg_line_chart(c) << "\n";
    // A heatmap of an eval grid: contexts across, rows (depths, tasks) down.
    auto heatmap = [&](const std::string& title, const char* y_label, std::vector<std::string> y_ticks,
                       const std::vector<int64_t>& contexts, const std::vector<std::vector<double>>& score) {
      Heatmap h;
      h.title = title;
      h.x_label = "context length (tokens)";
      h.y_label = y_label;
      for (int64_t x : contexts) h.x_ticks.push_back(std::to_string(x));
      h.y_ticks = std::move(y_ticks);
      h.value = score;
      o << svg_heatmap(h) << "\n";
    };
    for (const StageRun& s : stages)
      for (const NeedleGrid& g : s.needle) {
        std::vector<std::string> depths;
        for (double d : g.depths) depths.push_back(fixed(100 * d, 0) + "%");
        heatmap(s.name + ": " + g.name + " (needle retrieval)", "depth", depths, g.contexts, g.score);
      }
    for (const StageRun& s : stages)
      for (const SyntheticGrid& g : s.synthetic)
        heatmap(s.name + ": " + g.name + " (synthetic retrieval)", "task", g.tasks, g.contexts, g.score);
  }
}

// The data behind the page, as JSON that a script can read back.
void write_report_data(std::ostream& o, const std::vector<StageRun>& stages) {
  std::string data = report_data(stages).dump();
  for (size_t i = data.find("</"); i != std::string::npos; i = data.find("</", i + 3)) data.replace(i, 2, "<\\/");
  o << "<script type=\"application/json\" id=\"easyctx-report-data\">" << data << "</script>\n</body></html>\n";
}

}  // namespace

std::string render_report(const std::vector<StageRun>& stages, const std::string& title) {
  std::ostringstream o;
  write_head(o, title);
  write_stage_table(o, stages);
  write_training_charts(o, stages);
  write_memory_plans(o, stages);
  write_evaluations(o, stages);
  write_report_data(o, stages);
  return o.str();
}

}  // namespace easyctx::report
