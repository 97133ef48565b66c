// The sweep over a scripted Session: the grid and its order, the CSVs (the exact headers
// easyctx_report reads), summary.json, progress, and the heatmap PNGs read back: every cell's
// pixels are report::heat_colour of its score.
#include <cmath>
#include <map>

#include "core/json.h"
#include "core/strings.h"
#include "eval/heatmap.h"
#include "eval/needle.h"
#include "needle_test_util.h"
#include "report/run_report.h"
#include "report/svg.h"

namespace easyctx::test {
namespace {

using eval::Task;

eval::NeedleOptions small_options(const std::string& out) {
  eval::NeedleOptions o;
  o.session.model = "/models/scripted";
  o.tokenizer = "byte";
  o.output_dir = out;
  o.min_context = 200;
  o.max_context = 600;
  o.context_interval = 200;
  o.depth_interval = 0.25;
  o.samples = 6;
  o.task.digits = 5;
  o.task.distractors = 2;
  return o;
}


// Every pixel of every cell is heat_colour(score); the image is at least as large as the grid.
void check_heatmap_png(const std::string& path, const eval::HeatmapImage& h) {
  const eval::Canvas img = eval::read_png(path);
  const eval::HeatmapGeometry g = eval::heatmap_geometry(h);
  ASSERT_EQ(g.rows, static_cast<int>(h.value.size()));
  ASSERT_GE(img.width(), g.left + g.cols * g.cell_w);
  ASSERT_GE(img.height(), g.top + g.rows * g.cell_h);
  for (int r = 0; r < g.rows; ++r)
    for (int c = 0; c < g.cols; ++c) {
      const double v = h.value[static_cast<size_t>(r)][static_cast<size_t>(c)];
      const eval::Rgb want = eval::rgb(report::heat_colour(v));
      for (int y = g.top + r * g.cell_h; y < g.top + (r + 1) * g.cell_h; ++y)
        for (int x = g.left + c * g.cell_w; x < g.left + (c + 1) * g.cell_w; ++x)
          ASSERT_EQ(img.pixel(x, y), want) << path << " cell " << r << "," << c << " score " << v << " at " << x << ","
                                         << y;
    }
}

TEST(NeedleSweep, GridCsvReportAndHeatmap) {
  TempDir dir("needle-sweep");
  ByteTokenizer tok;
  ScriptedSession s;
  eval::NeedleOptions o = small_options(dir / "out");
  const eval::PromptBuilder b(tok, o.task);
  const std::vector<uint32_t> hay = tok.encode(haystack_text(5, 200));
  ASSERT_GE(hay.size(), 600u);
  std::vector<std::pair<size_t, size_t>> progress;
  int64_t last_tokens = 0;
  const eval::SweepResult r = eval::run_sweep(o, b, hay, s, [&](const eval::CellResult& c, const eval::SweepProgress& p) {
    progress.emplace_back(p.done, p.total);
    EXPECT_EQ(p.tokens, last_tokens + c.tokens);
    last_tokens = p.tokens;
    EXPECT_GE(p.eta, 0);
    if (p.done == p.total) {
      EXPECT_EQ(p.eta, 0);
    }
  });
  EXPECT_EQ(last_tokens, r.tokens);
  eval::log_progress()(r.cells[3], eval::SweepProgress{4, 15, 4000, 2.0, 5.5});  // the default logs a line
  // EasyContext's grid: lengths 200, 400, 600; depths 0, .25, .5, .75, 1; lengths outer.
  ASSERT_EQ(r.cells.size(), 15u);
  ASSERT_EQ(progress.size(), 15u);
  EXPECT_EQ(progress.back(), std::make_pair(size_t{15}, size_t{15}));
  EXPECT_EQ(s.seen.size(), 15u * 6u);
  const double depths[] = {0, 0.25, 0.5, 0.75, 1};
  for (size_t i = 0; i < r.cells.size(); ++i) {
    EXPECT_EQ(r.cells[i].context, 200 * static_cast<int64_t>(1 + i / 5));
    EXPECT_DOUBLE_EQ(r.cells[i].depth, depths[i % 5]);
    EXPECT_EQ(r.cells[i].samples, 6);
  }
  // Scores are what the session said, prompt by prompt.
  size_t k = 0;
  double sum = 0;
  for (const eval::CellResult& c : r.cells) {
    int64_t correct = 0;
    for (int j = 0; j < 6; ++j, ++k) correct += ScriptedSession::verdict(s.seen[k]);
    EXPECT_EQ(c.correct, correct);
    sum += c.score();
  }
  EXPECT_NEAR(r.average(Task::Needle), sum / 15, 1e-12);
  EXPECT_GT(r.average(Task::Needle), 0.2);
  EXPECT_LT(r.average(Task::Needle), 0.9);
  // Every sample of a cell asks for its own number, the same in every cell (EasyContext).
  const std::string first = tok.decode(std::vector<uint32_t>(s.seen[0].tokens.end() - 5, s.seen[0].tokens.end()));
  const std::string again = tok.decode(std::vector<uint32_t>(s.seen[6].tokens.end() - 5, s.seen[6].tokens.end()));
  EXPECT_EQ(first, again);

  eval::write_needle_outputs(o, r, s.describe(), "test haystack");
  const std::vector<std::string> lines = split(trim(read_file(dir / "out/needle.csv")), '\n');
  ASSERT_EQ(lines.size(), 16u);
  EXPECT_EQ(lines[0], "context,depth,score,samples");
  EXPECT_EQ(lines[1].substr(0, 6), "200,0,") << lines[1];
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), 4u);
    EXPECT_EQ(std::stoll(f[0]), r.cells[i - 1].context);
    EXPECT_DOUBLE_EQ(std::stod(f[1]), r.cells[i - 1].depth);
    EXPECT_NEAR(std::stod(f[2]), r.cells[i - 1].score(), 5e-5);
    EXPECT_EQ(f[2].size(), 6u) << "scores with 4 decimals: " << f[2];
    EXPECT_EQ(f[3], "6");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out/synthetic.csv"));
  // easyctx_report reads the CSV into the same grid.
  const report::StageRun run = report::read_stage(dir / "out");
  ASSERT_EQ(run.needle.size(), 1u);
  EXPECT_EQ(run.needle[0].contexts, (std::vector<int64_t>{200, 400, 600}));
  ASSERT_EQ(run.needle[0].depths.size(), 5u);
  for (size_t d = 0; d < 5; ++d)
    for (size_t c = 0; c < 3; ++c) EXPECT_NEAR(run.needle[0].score[d][c], r.cells[c * 5 + d].score(), 5e-5);
  // The image encodes the scores.
  const eval::HeatmapImage h = eval::needle_heatmap(r, "any title");
  EXPECT_EQ(h.y_ticks, (std::vector<std::string>{"0", "25", "50", "75", "100"}));
  EXPECT_EQ(h.x_ticks, (std::vector<std::string>{"200", "400", "600"}));
  for (size_t d = 0; d < 5; ++d)
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(h.value[d][c], r.cells[c * 5 + d].score());
  check_heatmap_png(dir / "out/needle.png", h);
  // summary.json: the average and the settings.
  const Json j = parse_json(read_file(dir / "out/summary.json"), "summary.json");
  EXPECT_NEAR(j.at("tasks").at("needle").at("average").as_double(), r.average(Task::Needle), 1e-12);
  EXPECT_EQ(j.at("tasks").at("needle").at("cells").as_int(), 15);
  EXPECT_EQ(j.at("options").at("distractors").as_int(), 2);
  EXPECT_EQ(j.at("session").as_string(), "scripted");
}

TEST(NeedleSweep, SyntheticTasksOneRowPerTaskAndLength) {
  TempDir dir("needle-synth");
  ByteTokenizer tok;
  ScriptedSession s;
  eval::NeedleOptions o = small_options(dir / "out");
  o.tasks = {Task::Passkey, Task::MultiKey, Task::MultiValue, Task::VariableTracking, Task::Needle};
  o.samples = 4;
  const eval::PromptBuilder b(tok, o.task);
  const std::vector<uint32_t> hay = tok.encode(haystack_text(5, 200));
  const eval::SweepResult r = eval::run_sweep(o, b, hay, s, nullptr);
  ASSERT_EQ(r.cells.size(), 4u * 3u + 15u);
  eval::write_needle_outputs(o, r, s.describe(), "");
  const std::vector<std::string> lines = split(trim(read_file(dir / "out/synthetic.csv")), '\n');
  ASSERT_EQ(lines.size(), 13u);
  EXPECT_EQ(lines[0], "task,context,score,samples");
  const char* names[] = {"passkey", "multikey", "multivalue", "vt"};
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), 4u);
    EXPECT_EQ(f[0], names[(i - 1) / 3]);
    EXPECT_EQ(std::stoll(f[1]), 200 * static_cast<int64_t>(1 + (i - 1) % 3));
    EXPECT_NEAR(std::stod(f[2]), r.cells[i - 1].score(), 5e-5);
    EXPECT_EQ(f[3], "4");
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "out/needle.csv"));
  const eval::HeatmapImage h = eval::synthetic_heatmap(r, "t");
  EXPECT_EQ(h.y_ticks, (std::vector<std::string>{"passkey", "multikey", "multivalue", "vt"}));
  check_heatmap_png(dir / "out/synthetic.png", h);
  const Json j = parse_json(read_file(dir / "out/summary.json"), "summary.json");
  for (const char* n : names) EXPECT_EQ(j.at("tasks").at(n).at("cells").as_int(), 3) << n;
}

TEST(NeedleSweep, ResultsDependOnTheSeedOnly) {
  ByteTokenizer tok;
  const std::vector<uint32_t> hay = tok.encode(haystack_text(5, 200));
  auto requests = [&](uint64_t seed) {
    ScriptedSession s;
    eval::NeedleOptions o = small_options("unused");
    o.seed = seed;
    o.tasks = {Task::Needle, Task::VariableTracking};
    const eval::PromptBuilder b(tok, o.task);
    eval::run_sweep(o, b, hay, s, nullptr);
    std::vector<std::vector<int32_t>> t;
    for (const auto& r : s.seen) t.push_back(r.tokens);
    return t;
  };
  EXPECT_EQ(requests(1), requests(1));
  EXPECT_NE(requests(1), requests(2));
}

TEST(NeedleSweep, HeatColoursAreEasyContexts) {
  EXPECT_EQ(eval::heat_rgb(0.0), (eval::Rgb{0xF0, 0x49, 0x6E}));
  EXPECT_EQ(eval::heat_rgb(0.5), (eval::Rgb{0xEB, 0xB8, 0x39}));
  EXPECT_EQ(eval::heat_rgb(1.0), (eval::Rgb{0x0C, 0xD7, 0x9F}));
  EXPECT_EQ(eval::heat_rgb(0.25), eval::rgb(report::heat_colour(0.25)));
  EXPECT_EQ(eval::heat_rgb(std::nan("")), (eval::Rgb{0xDD, 0xDD, 0xDD}));
  // A grid with a missing cell draws it grey.
  eval::HeatmapImage h;
  h.x_ticks = {"1", "2"};
  h.y_ticks = {"a"};
  h.value = {{std::nan(""), 0.75}};
  TempDir dir("needle-heat");
  eval::write_png(dir / "h.png", eval::draw_heatmap(h));
  check_heatmap_png(dir / "h.png", h);
  h.value = {{1.0}};
  EXPECT_THROW(eval::draw_heatmap(h), Error);
}

TEST(NeedleFlags, EasyContextsFlagsDashed) {
  const char* argv[] = {"easyctx_eval_needle", "--model", "m", "--tokenizer", "t.model", "--output-dir", "o",
                        "--min-context-length", "1000", "--max-context-length", "8000", "--context-interval", "1000",
                        "--depth-interval", "0.2", "--samples", "3", "--distractors", "2", "--digits", "6",
                        "--seed", "7", "--rope-theta", "500000", "--device", "cpu", "--sp-size", "2",
                        "--sp-mode", "ulysses", "--task", "needle,passkey,vt"};
  eval::NeedleOptions o;
  ASSERT_TRUE(eval::parse_needle_flags(static_cast<int>(std::size(argv)), argv, o, nullptr));
  EXPECT_EQ(o.session.model, "m");
  EXPECT_EQ(o.tokenizer, "t.model");
  EXPECT_EQ(o.haystack_dir, "");
  EXPECT_EQ(o.min_context, 1000);
  EXPECT_EQ(o.max_context, 8000);
  EXPECT_EQ(o.context_interval, 1000);
  EXPECT_DOUBLE_EQ(o.depth_interval, 0.2);
  EXPECT_EQ(o.samples, 3);
  EXPECT_EQ(o.task.distractors, 2);
  EXPECT_EQ(o.task.digits, 6);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.session.rope_theta, 500000);
  EXPECT_EQ(o.session.device, DeviceKind::Cpu);
  EXPECT_EQ(o.session.sp_size, 2);
  EXPECT_EQ(o.session.sp_mode, SeqParallelMode::Ulysses);
  EXPECT_EQ(o.tasks, (std::vector<Task>{Task::Needle, Task::Passkey, Task::VariableTracking}));
  EXPECT_EQ(eval::context_lengths(o).size(), 8u);
  EXPECT_EQ(eval::needle_depths(o).size(), 6u);
  // EasyContext's defaults.
  const char* minimal[] = {"x", "--model", "m", "--tokenizer", "t", "--output-dir", "o"};
  eval::NeedleOptions d;
  ASSERT_TRUE(eval::parse_needle_flags(7, minimal, d, nullptr));
  EXPECT_EQ(d.min_context, 1000);
  EXPECT_EQ(d.max_context, 100000);
  EXPECT_EQ(d.context_interval, 1000);
  EXPECT_EQ(d.samples, 10);
  EXPECT_EQ(d.task.digits, 7);
  EXPECT_EQ(d.task.distractors, 0);
  EXPECT_EQ(d.seed, 24242424u);
  EXPECT_EQ(eval::needle_depths(d).size(), 11u);
  EXPECT_DOUBLE_EQ(eval::needle_depths(d).back(), 1.0);
  std::string help;
  const char* h[] = {"x", "--help"};
  EXPECT_FALSE(eval::parse_needle_flags(2, h, d, &help));
  EXPECT_NE(help.find("--haystack-dir"), std::string::npos);
}

TEST(NeedleFlags, BadValuesNameTheFlag) {
  auto expect_flag = [](std::vector<const char*> extra, const std::string& flag) {
    std::vector<const char*> argv{"x", "--model", "m", "--tokenizer", "t", "--output-dir", "o"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    eval::NeedleOptions o;
    try {
      eval::parse_needle_flags(static_cast<int>(argv.size()), argv.data(), o, nullptr);
      ADD_FAILURE() << "no error for " << flag;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  expect_flag({"--depth-interval", "0"}, "--depth-interval");
  expect_flag({"--depth-interval", "1.5"}, "--depth-interval");
  expect_flag({"--min-context-length", "500", "--max-context-length", "100"}, "--max-context-length");
  expect_flag({"--context-interval", "0"}, "--context-interval");
  expect_flag({"--samples", "0"}, "--samples");
  expect_flag({"--task", "needle,haystack"}, "--task");
  expect_flag({"--device", "tpu"}, "--device");
  expect_flag({"--sp-mode", "ring"}, "--sp-mode");
  expect_flag({"--sp-size", "0"}, "--sp-size");
  expect_flag({"--digits", "30"}, "--digits");
  expect_flag({"--samples", "three"}, "samples");
  expect_flag({"--no-such-flag"}, "no-such-flag");
  std::vector<const char*> argv{"x", "--tokenizer", "t", "--output-dir", "o"};
  eval::NeedleOptions o;
  try {
    eval::parse_needle_flags(static_cast<int>(argv.size()), argv.data(), o, nullptr);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
}

// The whole program's path after the flags (tokenizer file, haystack, the model's vocabulary
// and BOS checked, outputs), with the CI tokenizer and a scripted session.
TEST(NeedleRun, ChecksTheTokenizerAgainstTheModel) {
  const std::string path = demo_tokenizer();
  REQUIRE_TOKENIZER(path, "the CI (KJV)");
  TempDir dir("needle-run");
  std::filesystem::create_directories(dir / "hay");
  write_file_atomic(dir / "hay/a.txt", haystack_text(1, 300));
  eval::NeedleOptions o = small_options(dir / "out");
  o.tokenizer = path;
  o.haystack_dir = dir / "hay";
  o.tasks = {Task::Needle, Task::Passkey};
  struct Big : ScriptedSession {
    int64_t vocab_size() const override { return 2000; }
  } s;
  const eval::SweepResult r = eval::run_needle(o, s, 0);
  EXPECT_EQ(r.cells.size(), 15u + 3u);
  EXPECT_TRUE(std::filesystem::exists(dir / "out/needle.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/synthetic.png"));
  ScriptedSession small;  // vocab 259 < the tokenizer's 2000
  try {
    eval::run_needle(o, small, 0);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace easyctx::test
