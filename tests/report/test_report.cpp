// lib/report: the run report reads a chain of output folders (metrics.jsonl, plan.json, eval
// CSVs) into one page whose embedded data equals what was written: every stage's steps and
// losses in order, its restarts where the elapsed time went back, the perplexity curves and
// the needle grids; the heatmap cells carry EasyContext's colours for their scores.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

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
  EXPECT_NE(page.find("fits on 2 x 8 A100-80GB (host 1024 GiB per node); per GPU " + g(p.gpu_peak_bytes) +
                      " GiB at " + p.gpu_peak_phase + " (context 3.60 + model state "),
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
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(d.string()), std::string::npos) << e.what();
  }
  fs::remove_all(d);
  EXPECT_THROW(report::read_stage((d / "missing").string()), InputError);
}
