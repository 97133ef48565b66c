// lib/report: the run report reads a chain of output folders (metrics.jsonl, plan.json, eval
// CSVs) into one page whose embedded data equals what was written: every stage's steps and
// losses in order, its restarts where the elapsed time went back, the perplexity curves and
// the needle grids; the heatmap cells carry EasyContext's colours for their scores. Log axes
// tick at 1-2-5 x 10^k (powers of ten over many decades), marker labels never overlap, and a
// CPU run's plan shows no GPU figure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "plan/memory_plan.h"
#include "plan/target.h"
#include "report/run_report.h"
#include "report/svg.h"
#include "test_util.h"

using namespace easyctx;
namespace fs = std::filesystem;

namespace {

struct Written {
  std::vector<double> loss;
  std::vector<int64_t> restarts;  // steps of the first record after a restart
};

// A stage folder with `steps` metrics records, restarted before each step in `restarts`.
Written write_stage(const fs::path& dir, int64_t steps, const std::vector<int64_t>& restarts, std::mt19937_64& rng) {
  fs::create_directories(dir);
  std::uniform_real_distribution<double> u(0.5, 9.0);
  std::ofstream f(dir / "metrics.jsonl");
  Written w;
  double elapsed = 0;
  for (int64_t s = 1; s <= steps; ++s) {
    elapsed += 1.0 + u(rng);
    if (std::find(restarts.begin(), restarts.end(), s) != restarts.end()) {
      elapsed = 0.5;  // a resumed process starts its clock again
      w.restarts.push_back(s);
    }
    Json r = Json::object();
    r.set("step", s);
    r.set("loss", u(rng));
    r.set("lr", 1e-4);
    r.set("tokens_per_s", 1000 * u(rng));
    r.set("elapsed", elapsed);
    w.loss.push_back(r.at("loss").as_double());
    f << r.dump() << "\n";
  }
  return w;
}

std::string between(const std::string& s, const std::string& a, const std::string& b) {
  const size_t i = s.find(a);
  if (i == std::string::npos) return "";
  const size_t j = s.find(b, i + a.size());
  return s.substr(i + a.size(), j - i - a.size());
}

// A marker label of an SVG chart: where svg_line_chart wrote it.
struct MarkerText {
  double x0, x1, y;
  std::string label;
};

// The marker labels of every chart in `page`, and how many marker lines (class-less dashed
// lines) carry a tooltip instead.
std::vector<std::vector<MarkerText>> marker_texts(const std::string& page, size_t* tooltips = nullptr) {
  std::vector<std::vector<MarkerText>> charts;
  const std::regex text(
      "<text x=\"([-0-9.]+)\" y=\"([-0-9.]+)\"( text-anchor=\"end\")? class=\"marker\"[^>]*>([^<]*)</text>");
  for (size_t i = page.find("<svg class=\"chart\""); i != std::string::npos;
       i = page.find("<svg class=\"chart\"", i + 1)) {
    const std::string svg = page.substr(i, page.find("</svg>", i) - i);
    std::vector<MarkerText> m;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator(); ++it) {
      const std::smatch& g = *it;
      const double x = std::stod(g[1]), w = report::marker_label_width(g[4]);
      const bool end = g[3].matched;
      m.push_back({end ? x - w : x, end ? x : x + w, std::stod(g[2]), g[4]});
    }
    charts.push_back(m);
    if (tooltips)
      for (size_t k = svg.find("stroke-dasharray=\"4 3\"><title>"); k != std::string::npos;
           k = svg.find("stroke-dasharray=\"4 3\"><title>", k + 1))
        ++*tooltips;
  }
  return charts;
}

// No two labels of a chart in the same row overlap, and each stays inside the plot [left, right].
void expect_apart(const std::vector<MarkerText>& m, double left, double right) {
  for (size_t a = 0; a < m.size(); ++a) {
    EXPECT_GE(m[a].x0, left - 1e-6) << m[a].label;
    EXPECT_LE(m[a].x1, right + 1e-6) << m[a].label;
    for (size_t b = a + 1; b < m.size(); ++b)
      if (m[a].y == m[b].y) {
        EXPECT_TRUE(m[a].x1 <= m[b].x0 || m[b].x1 <= m[a].x0)
            << m[a].label << " [" << m[a].x0 << ", " << m[a].x1 << "] and " << m[b].label << " [" << m[b].x0 << ", "
            << m[b].x1 << "] at y " << m[a].y;
      }
  }
}

// The y tick labels of the first chart in `svg` (right-aligned tick texts), top to bottom.
std::vector<std::string> y_tick_labels(const std::string& svg) {
  std::vector<std::string> out;
  const std::regex tick("text-anchor=\"end\" class=\"tick\">([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Report, PageDataEqualsTheRunsFolders) {
  std::mt19937_64 rng(test::test_seed());
  const fs::path root = fs::temp_directory_path() / ("easyctx-report-" + std::to_string(rng()));
  const Written s1 = write_stage(root / "s1", 17, {}, rng), s2 = write_stage(root / "s2", 23, {9, 20}, rng);
  std::ofstream(root / "s1" / "DONE") << "17\n";
  fs::create_directories(root / "s2" / "eval");
  std::ofstream ppl(root / "s2" / "eval" / "ppl.csv");
  ppl << "tokens,ppl,documents,nll\n1024,12.5,4,2.52\n2048,nan,0,nan\n4096,9.25,3,2.22\n";
  ppl.close();
  std::ofstream nd(root / "s2" / "needle.csv");
  nd << "context,depth,score,samples\n2048,0,1,4\n2048,0.5,0.25,4\n4096,0,0.75,4\n";
  nd.close();
  // easyctx_eval_needle's synthetic.csv: random scores, one task missing at one length.
  std::uniform_int_distribution<int> hits(0, 8);
  const double sp2 = hits(rng) / 8.0, sp4 = hits(rng) / 8.0, vt2 = hits(rng) / 8.0;
  std::ofstream sy(root / "s2" / "eval" / "synthetic.csv");
  sy << "task,context,score,samples\npasskey,2048," << sp2 << ",8\npasskey,4096," << sp4 << ",8\nvt,2048," << vt2
     << ",8\n";
  sy.close();
  std::vector<report::StageRun> stages = {report::read_stage((root / "s1").string()),
                                          report::read_stage((root / "s2").string())};
  const std::string page = report::render_report(stages, "chain </script> & more");
  EXPECT_EQ(page.find("Memory plans"), std::string::npos) << "a heading without plans";  // neither stage has one
  EXPECT_EQ(page.find("http"), page.find("http://www.w3.org/2000/svg")) << "nothing may be fetched";
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_NE(page.find("chain &lt;/script&gt; &amp; more"), std::string::npos) << "the title is escaped";
  const Json data = parse_json(between(page, "id=\"easyctx-report-data\">", "</script>"), "report data");
  const Json& st = data.at("stages");
  ASSERT_EQ(st.size(), 2u);
  const Written* w[] = {&s1, &s2};
  for (size_t i = 0; i < 2; ++i) {
    const Json& j = st[i];
    ASSERT_EQ(j.at("loss").size(), w[i]->loss.size());
    for (size_t k = 0; k < w[i]->loss.size(); ++k) {
      EXPECT_EQ(j.at("steps")[k].as_int(), static_cast<int64_t>(k + 1));
      EXPECT_DOUBLE_EQ(j.at("loss")[k].as_double(), w[i]->loss[k]);
    }
    ASSERT_EQ(j.at("restarts_at_step").size(), w[i]->restarts.size());
    for (size_t k = 0; k < w[i]->restarts.size(); ++k)
      EXPECT_EQ(j.at("restarts_at_step")[k].as_int(), w[i]->restarts[k]);
  }
  EXPECT_TRUE(st[0].at("done").as_bool());
  EXPECT_FALSE(st[1].at("done").as_bool());
  EXPECT_EQ(st[1].at("first_global_step").as_int(), 17) << "stage 2 starts where stage 1 ended";
  const Json& p = st[1].at("ppl")[0];
  EXPECT_DOUBLE_EQ(p.at("ppl")[0].as_double(), 12.5);
  EXPECT_TRUE(p.at("ppl")[1].is_null()) << "nan is written as null";
  const Json& n = st[1].at("needle")[0];
  EXPECT_EQ(n.at("contexts").size(), 2u);
  EXPECT_DOUBLE_EQ(n.at("score")[1][0].as_double(), 0.25);  // depth 0.5, context 2048
  EXPECT_TRUE(n.at("score")[1][1].is_null());               // depth 0.5, context 4096: absent
  const Json& sy2 = st[1].at("synthetic")[0];
  ASSERT_EQ(sy2.at("tasks").size(), 2u);
  EXPECT_EQ(sy2.at("tasks")[0].as_string(), "passkey");
  EXPECT_EQ(sy2.at("tasks")[1].as_string(), "vt");
  EXPECT_DOUBLE_EQ(sy2.at("score")[0][0].as_double(), sp2);
  EXPECT_DOUBLE_EQ(sy2.at("score")[0][1].as_double(), sp4);
  EXPECT_DOUBLE_EQ(sy2.at("score")[1][0].as_double(), vt2);
  EXPECT_TRUE(sy2.at("score")[1][1].is_null());  // vt at 4096: absent
  EXPECT_NE(page.find("synthetic.csv (synthetic retrieval)"), std::string::npos);
  // Every heatmap cell's colour is the scale's colour for its score.
  size_t cells = 0;
  for (size_t i = page.find("data-score=\""); i != std::string::npos; i = page.find("data-score=\"", i + 1)) {
    const std::string score = between(page.substr(i), "data-score=\"", "\"");
    const size_t f = page.rfind("fill=\"", i);
    const std::string fill = between(page.substr(f), "fill=\"", "\"");
    EXPECT_EQ(fill, report::heat_colour(score == "nan" ? NAN : std::stod(score)));
    ++cells;
  }
  EXPECT_EQ(cells, 8u);  // 2 x 2 needle cells, 2 x 2 synthetic cells
  for (const auto& chart : marker_texts(page)) expect_apart(chart, 70, 760 - 150);
  if (const char* keep = std::getenv("EASYCTX_REPORT_PAGE")) write_file_atomic(keep, page);  // (to look at it)
  fs::remove_all(root);
}

// A GPU stage's plan.json (plan::plan_to_json of a recipe-like plan: llama2-7b, ZeRO-3 with the
// optimizer offloaded, 2 x 8 A100-80GB): the page's data carries its per-GPU and per-node
// peaks and settings as written, and the page names the target, the per-GPU categories that
// add up to the peak, and the knobs.
TEST(Report, ShowsTheMemoryPlanOfAGpuStage) {
  StageConfig c;
  c.model.config = "llama2-7b";
  c.data.seq_length = 65536;
  c.train.device = DeviceKind::Cuda;
  c.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  c.activation.mlp_tile = 16384;
  c.parallel.zero.stage = 3;
  c.parallel.zero.offload_optimizer = true;
  c.target.gpu = "A100-80GB";
  c.target.gpus_per_node = 8;
  c.target.nodes = 2;
  c.target.host_memory_gib = 1024;
  const plan::MemoryPlan p = plan::plan_memory(c, plan::resolve_target(c, 1, 1));
  ASSERT_TRUE(p.fits) << plan::refusal_message(p);
  const fs::path root = fs::temp_directory_path() / ("easyctx-report-plan-" + std::to_string(test::test_seed()));
  fs::create_directories(root / "s2");
  write_file_atomic((root / "s2" / "plan.json").string(), plan::plan_to_json(p).dump(1) + "\n");
  const report::StageRun st = report::read_stage((root / "s2").string());
  const Json data = report::report_data({st});
  const Json& pl = data.at("stages")[0].at("plan");
  EXPECT_EQ(pl.at("gpu_device_total_bytes").as_int(), p.gpu_peak_bytes);
  EXPECT_EQ(pl.at("host_per_node_peak_bytes").as_int(), p.host_peak_bytes);
  EXPECT_EQ(pl.at("settings").at("activation.checkpoint").as_string(), "attention_output");
  const std::string page = report::render_report({st}, "plan");
  auto g = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1 << 30));
    return std::string(buf);
  };
  EXPECT_NE(page.find("fits on 2 x 8 A100-80GB (host 1024 GiB per node); per GPU " + g(p.gpu_peak_bytes) + " GiB at " +
                      p.gpu_peak_phase + " (context 3.60 + model state "),
            std::string::npos);
  EXPECT_NE(page.find("host per node " + g(p.host_peak_bytes) + " GiB at " + p.host_peak_phase), std::string::npos);
  EXPECT_NE(page.find("parallel.zero.offload_optimizer true"), std::string::npos);
  fs::remove_all(root);
}

TEST(Report, HeatColoursAreEasyContexts) {
  EXPECT_EQ(report::heat_colour(0), "#F0496E");
  EXPECT_EQ(report::heat_colour(0.5), "#EBB839");
  EXPECT_EQ(report::heat_colour(1), "#0CD79F");
  EXPECT_EQ(report::heat_colour(-1), "#F0496E");
  EXPECT_EQ(report::heat_colour(NAN), "#dddddd");
}

TEST(Report, RefusesAFolderWithoutARun) {
  const fs::path d = fs::temp_directory_path() / ("easyctx-report-empty-" + std::to_string(test::test_seed()));
  fs::create_directories(d);
  try {
    report::read_stage(d.string());
    FAIL() << "an empty folder was accepted";
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find(d.string()), std::string::npos) << e.what(); }
  fs::remove_all(d);
  EXPECT_THROW(report::read_stage((d / "missing").string()), InputError);
}

// Log axes tick at 1-2-5 x 10^k, powers of ten over many decades, round linear steps within
// half a decade; always 2 to 8 ticks inside the range, ascending.
TEST(Report, LogAxisTicksAtOneTwoFive) {
  EXPECT_EQ(report::log_ticks(0.8, 31.6), (std::vector<double>{1, 2, 5, 10, 20}));
  EXPECT_EQ(report::log_ticks(0.004, 0.3), (std::vector<double>{0.005, 0.01, 0.02, 0.05, 0.1, 0.2}));
  EXPECT_EQ(report::log_ticks(3, 2000), (std::vector<double>{10, 100, 1000}));
  EXPECT_EQ(report::log_ticks(1e-6, 1e3), (std::vector<double>{1e-6, 1e-4, 1e-2, 1, 100}));
  EXPECT_EQ(report::log_tick_label(1), "1");
  EXPECT_EQ(report::log_tick_label(20), "20");
  EXPECT_EQ(report::log_tick_label(0.5), "0.5");
  EXPECT_EQ(report::log_tick_label(0.001), "0.001");
  EXPECT_EQ(report::log_tick_label(5000), "5000");
  EXPECT_EQ(report::log_tick_label(2e-5), "2e-5");
  EXPECT_EQ(report::log_tick_label(1e5), "100K");
  EXPECT_EQ(report::log_tick_label(2e6), "2M");
  std::mt19937_64 rng(test::test_seed());
  std::uniform_real_distribution<double> start(-7, 7), span(0.02, 14);
  for (int i = 0; i < 2000; ++i) {
    const double a = start(rng), d = span(rng), lo = std::pow(10.0, a), hi = std::pow(10.0, a + d);
    const std::vector<double> t = report::log_ticks(lo, hi);
    ASSERT_GE(t.size(), 2u) << lo << " " << hi;
    ASSERT_LE(t.size(), 8u) << lo << " " << hi;
    for (size_t k = 0; k < t.size(); ++k) {
      EXPECT_GE(t[k], lo * (1 - 1e-9)) << lo << " " << hi;
      EXPECT_LE(t[k], hi * (1 + 1e-9)) << lo << " " << hi;
      if (k > 0) { EXPECT_GT(t[k], t[k - 1]); }
      if (d >= 1) {  // (a decade holds at least two 1-2-5 values)
        const double m = t[k] / std::pow(10.0, std::floor(std::log10(t[k]) + 1e-9));
        EXPECT_TRUE(std::fabs(m - 1) < 1e-9 || std::fabs(m - 2) < 1e-9 || std::fabs(m - 5) < 1e-9)
            << t[k] << " in [" << lo << ", " << hi << "]";
        if (d > 4) { EXPECT_LT(std::fabs(m - 1), 1e-9) << t[k] << ": powers of ten over " << d << " decades"; }
      }
    }
  }
  // The gradient-norm chart of a run: norms from 0.7 to 31.6 on a log axis.
  report::LineChart c;
  c.title = "Gradient norm";
  c.log_y = true;
  report::Series sr;
  for (int i = 0; i < 50; ++i) sr.x.push_back(i), sr.y.push_back(std::pow(10.0, -0.155 + 1.655 * i / 49.0));
  c.series.push_back(sr);
  EXPECT_EQ(y_tick_labels(report::svg_line_chart(c)), (std::vector<std::string>{"20", "10", "5", "2", "1"}));
}

// The step axis (integer_x) ticks at whole steps only: runs of 1 to 400 steps, starting
// anywhere, never get 2.5 or 7.5; a real-valued axis keeps 2.5 steps where they are roundest.
TEST(Report, StepAxisTicksAreWholeNumbers) {
  const std::regex tick("text-anchor=\"middle\" class=\"tick\">([^<]*)</text>");
  auto x_ticks = [&](const report::LineChart& c) {
    const std::string svg = report::svg_line_chart(c);
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
      out.push_back((*it)[1]);
    return out;
  };
  std::mt19937_64 rng(test::test_seed());
  std::uniform_int_distribution<int> steps(1, 400), first(0, 50);
  for (int i = 0; i < 200; ++i) {
    report::LineChart c;
    c.integer_x = true;
    report::Series sr;
    const int a = first(rng), n = steps(rng);
    for (int x = a; x <= a + n; ++x) sr.x.push_back(x), sr.y.push_back(1.0 + x % 7);
    c.series.push_back(sr);
    const std::vector<std::string> t = x_ticks(c);
    ASSERT_FALSE(t.empty()) << a << " + " << n;
    for (const std::string& l : t) EXPECT_EQ(l.find('.'), std::string::npos) << l << " on steps " << a << ".." << a + n;
  }
  report::LineChart c;  // 0..15: 2.5 is the round step of a real axis
  report::Series sr;
  for (int x = 0; x <= 15; ++x) sr.x.push_back(x), sr.y.push_back(x);
  c.series.push_back(sr);
  EXPECT_EQ(x_ticks(c), (std::vector<std::string>{"0", "2.5", "5", "7.5", "10", "12.5", "15"}));
  c.integer_x = true;
  EXPECT_EQ(x_ticks(c), (std::vector<std::string>{"0", "5", "10", "15"}));
}

// Marker labels (stage boundaries, restarts) a few steps apart go to rows of their own or are
// left out, the line then naming them in its tooltip; none crosses the plot's edges.
TEST(Report, MarkerLabelsDoNotOverlap) {
  const std::vector<report::LabelPlace> p = report::place_marker_labels(
      {100, 101, 140, 103, 102, 498}, {"s2-64k", "restart", "s3-256k", "restart", "restart", "s4-256k"}, 70, 500);
  EXPECT_TRUE(p[0].shown && p[0].row == 0 && !p[0].end_anchor);
  EXPECT_TRUE(p[1].shown && p[1].row == 1);
  EXPECT_TRUE(p[4].shown && p[4].row == 2);
  EXPECT_FALSE(p[3].shown) << "three rows taken at x 100-103";
  EXPECT_TRUE(p[2].shown && p[2].row == 0) << "x 140 is clear of s2-64k's label (103 + 36)";
  EXPECT_TRUE(p[5].shown && p[5].end_anchor && p[5].x1 == 495) << "the last one is written before its line";
  // A chain of three stages of 40 steps, restarts 1, 9 and 39 steps after a boundary.
  report::LineChart c;
  c.title = "Loss";
  for (int s = 0; s < 3; ++s) {
    report::Series sr;
    sr.name = "s" + std::to_string(s + 1);
    for (int i = 1; i <= 40; ++i) sr.x.push_back(40 * s + i), sr.y.push_back(1 + 0.01 * i);
    c.series.push_back(sr);
  }
  c.markers = {{40, "s2-64k"},  {41, "restart", "#d62728"},  {49, "restart", "#d62728"},
               {80, "s3-256k"}, {119, "restart", "#d62728"}, {120, "restart", "#d62728"}};
  size_t tooltips = 0;
  const auto charts = marker_texts(report::svg_line_chart(c), &tooltips);
  ASSERT_EQ(charts.size(), 1u);
  expect_apart(charts[0], 70, 760 - 150);
  EXPECT_EQ(charts[0].size() + tooltips, c.markers.size()) << "every marker has its label or a tooltip";
  EXPECT_EQ(charts[0].size(), c.markers.size()) << "three rows hold these six";
  // Random markers: never an overlap, every one named.
  std::mt19937_64 rng(test::test_seed());
  std::uniform_real_distribution<double> at(1, 120);
  std::uniform_int_distribution<int> count(1, 14);
  for (int i = 0; i < 200; ++i) {
    c.markers.clear();
    for (int k = count(rng); k > 0; --k)
      c.markers.push_back({std::round(at(rng)), k % 3 ? "restart" : "s" + std::to_string(k) + "-256k"});
    size_t tips = 0;
    const auto got = marker_texts(report::svg_line_chart(c), &tips);
    expect_apart(got[0], 70, 760 - 150);
    EXPECT_EQ(got[0].size() + tips, c.markers.size());
  }
}

// A CPU run's plan (target.backend cpu): the stages table says so instead of a per-GPU 0.00,
// and its memory plan shows host figures only.
TEST(Report, CpuPlanShowsHostFiguresOnly) {
  StageConfig c;
  c.model.config = "demo";
  c.data.seq_length = 256;
  c.train.device = DeviceKind::Cpu;
  const plan::MemoryPlan p = plan::plan_memory(c, plan::resolve_target(c, 1, 1));
  const fs::path root = fs::temp_directory_path() / ("easyctx-report-cpu-" + std::to_string(test::test_seed()));
  fs::create_directories(root / "cpu");
  write_file_atomic((root / "cpu" / "plan.json").string(), plan::plan_to_json(p).dump(1) + "\n");
  const std::string page = report::render_report({report::read_stage((root / "cpu").string())}, "cpu");
  const std::string row = between(page, "<td class=\"l\">cpu</td>", "</tr>");
  EXPECT_NE(row.find("<td>n/a (CPU run)</td>"), std::string::npos) << row;
  char host[32];
  std::snprintf(host, sizeof host, "%.2f", static_cast<double>(p.host_peak_bytes) / (1 << 30));
  EXPECT_NE(row.find(std::string("<td>") + host + "</td>"), std::string::npos) << row;
  const std::string plans = page.substr(page.find("<h2>Memory plans</h2>"));
  EXPECT_NE(plans.find("CPU rank(s)"), std::string::npos);
  EXPECT_NE(plans.find(std::string("host per node ") + host + " GiB"), std::string::npos);
  EXPECT_EQ(plans.find("per GPU"), std::string::npos);
  EXPECT_EQ(plans.find("device total"), std::string::npos);
  fs::remove_all(root);
}
