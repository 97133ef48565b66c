// The sweep through the real session (a small random Llama of vocabulary 2000, with the CI
// tokenizer): the grid and its order, every cell's count and answer NLL equal to
// scoring its prompts alone, the CSVs (the exact headers easyctx_report reads), summary.json,
// progress; the heatmap PNGs read back: every cell's pixels are report::heat_colour of its
// score, and the score comes back from the colour; depth down the y axis, tokens across.
#include <cmath>
#include <map>
#include <random>

#include "core/json.h"
#include "core/strings.h"
#include "dist/comm_mpi.h"
#include "eval/heatmap.h"
#include "eval/needle.h"
#include "needle_test_util.h"
#include "report/run_report.h"
#include "report/svg.h"

namespace easyctx::test {
namespace {

using eval::Task;

dist::MpiComm& self_comm() {
  static dist::MpiComm self(MPI_COMM_SELF, "self", 600);
  return self;
}

// A small Llama of the CI tokenizer's vocabulary, random weights (random:YAML@SEED).
std::string small_model(uint64_t seed) {
  static TempDir dir("needle-model");
  const std::string yaml = dir / "small2000.yaml";
  if (!std::filesystem::exists(yaml))
    write_file_atomic(yaml,
                      "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                      "head_dim: 8\nintermediate_size: 64\nvocab_size: 2000\nmax_position_embeddings: 4096\n"
                      "rms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\nbos_token_id: 1\n"
                      "eos_token_id: 2\n");
  return "random:" + yaml + "@" + std::to_string(seed % 100000);
}

eval::NeedleOptions small_options(const std::string& out, uint64_t seed) {
  eval::NeedleOptions o;
  o.session.model = small_model(seed);
  o.session.device = DeviceKind::Cpu;
  o.tokenizer = demo_tokenizer();
  o.output_dir = out;
  o.min_context = 200;
  o.max_context = 600;
  o.context_interval = 200;
  o.depth_interval = 0.25;
  o.samples = 3;
  o.seed = seed;
  o.task.digits = 5;
  o.task.distractors = 2;
  return o;
}

// Every pixel of every cell is heat_colour(score); the image holds the grid.
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
          ASSERT_EQ(img.pixel(x, y), want)
              << path << " cell " << r << "," << c << " score " << v << " at " << x << "," << y;
    }
}

// The score a heat colour stands for (the closest of 1001 steps of the scale); -1 for grey.
double score_of(eval::Rgb c) {
  if (c == eval::rgb(report::heat_colour(std::nan("")))) return -1;
  double best = -1, dist = 1e9;
  for (int i = 0; i <= 1000; ++i) {
    const eval::Rgb h = eval::heat_rgb(i / 1000.0);
    const double d = std::abs(h.r - c.r) + std::abs(h.g - c.g) + std::abs(h.b - c.b);
    if (d < dist) dist = d, best = i / 1000.0;
  }
  return dist <= 3 ? best : -2;
}

// Scores each cell's prompts alone (one score_spans call per cell): the sweep's counts and
// answer NLLs must be these, bit for bit (one rank: the same computation).
void expect_cells_score_alone(const eval::NeedleOptions& o, const eval::PromptBuilder& b,
                              const std::vector<uint32_t>& hay, eval::Session& s, const eval::SweepResult& r) {
  const std::vector<uint32_t> noise = b.noise_haystack(o.max_context);
  const std::vector<double> depths = eval::needle_depths(o);
  for (const eval::CellResult& c : r.cells) {
    size_t d = 0;
    if (c.task == Task::Needle)
      d = static_cast<size_t>(std::find(depths.begin(), depths.end(), c.depth) - depths.begin());
    const std::vector<eval::Prompt> ps = eval::cell_prompts(o, b, hay, noise, c.task, c.context, d);
    ASSERT_EQ(ps.size(), static_cast<size_t>(o.samples));
    std::vector<eval::ScoreRequest> reqs;
    int64_t tokens = 0, answer_tokens = 0;
    for (const eval::Prompt& p : ps) {
      reqs.push_back(p.request());
      tokens += static_cast<int64_t>(p.tokens.size());
      answer_tokens += p.answer_length;
    }
    const auto sc = s.score_spans(reqs);
    int64_t correct = 0;
    double nll = 0;
    for (const auto& x : sc) correct += x.at(0).all_argmax, nll += x.at(0).sum_nll;
    const std::string where =
        std::string(eval::task_name(c.task)) + " L=" + std::to_string(c.context) + " depth " + std::to_string(c.depth);
    EXPECT_EQ(c.samples, o.samples) << where;
    EXPECT_EQ(c.correct, correct) << where;
    EXPECT_EQ(c.answer_nll, nll) << where;
    EXPECT_EQ(c.answer_tokens, answer_tokens) << where;
    EXPECT_EQ(c.tokens, tokens) << where;
    // A random model of 2000 ids: about log(2000) = 7.6 nats per answer token.
    EXPECT_GT(c.mean_answer_nll(), 6.0) << where;
    EXPECT_LT(c.mean_answer_nll(), 9.5) << where;
  }
}

TEST(NeedleSweep, GridCsvReportAndHeatmap) {
  TempDir dir("needle-sweep");
  const eval::NeedleOptions o = small_options(dir / "out", test_seed());
  const auto tok = data::load_tokenizer(o.tokenizer);
  const eval::PromptBuilder b(*tok, o.task);
  const std::vector<uint32_t> hay = tok->encode(haystack_text(test_seed(), 200));
  ASSERT_GE(hay.size(), 600u);
  eval::SweepRelay relay;
  eval::SessionOptions so = o.session;
  so.progress = relay.callback();
  const auto s = eval::open_session(so, self_comm());
  std::vector<int64_t> finished_sizes;
  int in_call = 0;
  int64_t last_prompts = 0;
  eval::SweepProgress last;
  const eval::SweepResult r = eval::run_sweep(
      o, b, hay, *s,
      [&](const eval::SweepProgress& p, const std::vector<eval::CellResult>& finished) {
        EXPECT_GE(p.prompts_done, last_prompts);
        last_prompts = p.prompts_done;
        EXPECT_LE(p.work_done, p.work_total);
        if (finished.empty()) {
          ++in_call;
          EXPECT_LT(p.prompts_done, p.prompts_total);
          EXPECT_GT(p.eta(), 0);
        } else {
          finished_sizes.push_back(static_cast<int64_t>(finished.size()));
          EXPECT_EQ(p.cells_done % 5, 0);
          for (const eval::CellResult& c : finished) EXPECT_EQ(c.context, finished[0].context);
        }
        last = p;
      },
      &relay);
  // A length's five depths in one call each (the session's data-parallel groups share them),
  // with the session's rounds reported in between.
  EXPECT_EQ(finished_sizes, (std::vector<int64_t>{5, 5, 5}));
  EXPECT_GE(in_call, 3 * 14);
  EXPECT_EQ(last.cells_done, 15);
  EXPECT_EQ(last.cells_total, 15);
  EXPECT_EQ(last.prompts_done, 45);
  EXPECT_EQ(last.tokens, r.tokens);
  EXPECT_EQ(last.eta(), 0);
  // EasyContext's grid: lengths 200, 400, 600; depths 0, .25, .5, .75, 1; lengths outer.
  ASSERT_EQ(r.cells.size(), 15u);
  const double depths[] = {0, 0.25, 0.5, 0.75, 1};
  for (size_t i = 0; i < r.cells.size(); ++i) {
    EXPECT_EQ(r.cells[i].context, 200 * static_cast<int64_t>(1 + i / 5));
    EXPECT_DOUBLE_EQ(r.cells[i].depth, depths[i % 5]);
  }
  expect_cells_score_alone(o, b, hay, *s, r);
  double sum = 0;
  for (const eval::CellResult& c : r.cells) sum += c.score();
  EXPECT_NEAR(r.average(Task::Needle), sum / 15, 1e-12);
  // Every sample of a cell asks for its own number, the same in every cell (EasyContext).
  const std::vector<uint32_t> noise;
  const auto a = eval::cell_prompts(o, b, hay, noise, Task::Needle, 200, 0);
  const auto c = eval::cell_prompts(o, b, hay, noise, Task::Needle, 600, 3);
  for (int k = 0; k < o.samples; ++k) EXPECT_EQ(a[static_cast<size_t>(k)].answer, c[static_cast<size_t>(k)].answer);
  EXPECT_NE(a[0].answer, a[1].answer);

  eval::write_needle_outputs(o, r, s->describe(), "test haystack");
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
    EXPECT_EQ(f[3], "3");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out/synthetic.csv"));
  // easyctx_report reads the CSV into the same grid.
  const report::StageRun run = report::read_stage(dir / "out");
  ASSERT_EQ(run.needle.size(), 1u);
  EXPECT_EQ(run.needle[0].contexts, (std::vector<int64_t>{200, 400, 600}));
  ASSERT_EQ(run.needle[0].depths.size(), 5u);
  for (size_t d = 0; d < 5; ++d)
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(run.needle[0].score[d][k], r.cells[k * 5 + d].score(), 5e-5);
  // The image encodes the scores: depth down, tokens across.
  const eval::HeatmapImage h = eval::needle_heatmap(r, "any title");
  EXPECT_EQ(h.y_ticks, (std::vector<std::string>{"0", "25", "50", "75", "100"}));
  EXPECT_EQ(h.x_ticks, (std::vector<std::string>{"200", "400", "600"}));
  EXPECT_EQ(h.y_label, "Depth Percent");
  EXPECT_EQ(h.x_label, "Token Limit");
  for (size_t d = 0; d < 5; ++d)
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(h.value[d][k], r.cells[k * 5 + d].score());
  check_heatmap_png(dir / "out/needle.png", h);
  // summary.json: the average, the answers' NLL and the settings.
  const Json j = parse_json(read_file(dir / "out/summary.json"), "summary.json");
  EXPECT_NEAR(j.at("tasks").at("needle").at("average").as_double(), r.average(Task::Needle), 1e-12);
  EXPECT_EQ(j.at("tasks").at("needle").at("cells").as_int(), 15);
  EXPECT_GT(j.at("tasks").at("needle").at("answer_nll").as_double(), 6.0);
  EXPECT_EQ(j.at("options").at("distractors").as_int(), 2);
  EXPECT_EQ(j.at("session").as_string(), s->describe());
}

TEST(NeedleSweep, SyntheticTasksOneRowPerTaskAndLength) {
  TempDir dir("needle-synth");
  eval::NeedleOptions o = small_options(dir / "out", test_seed());
  o.tasks = {Task::Passkey, Task::MultiKey, Task::MultiValue, Task::VariableTracking, Task::Needle};
  o.samples = 2;
  const auto tok = data::load_tokenizer(o.tokenizer);
  const eval::PromptBuilder b(*tok, o.task);
  const std::vector<uint32_t> hay = tok->encode(haystack_text(test_seed(), 200));
  const auto s = eval::open_session(o.session, self_comm());
  const eval::SweepResult r = eval::run_sweep(o, b, hay, *s);
  ASSERT_EQ(r.cells.size(), 4u * 3u + 15u);
  expect_cells_score_alone(o, b, hay, *s, r);
  eval::write_needle_outputs(o, r, s->describe(), "");
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
    EXPECT_EQ(f[3], "2");
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "out/needle.csv"));
  const eval::HeatmapImage h = eval::synthetic_heatmap(r, "t");
  EXPECT_EQ(h.y_ticks, (std::vector<std::string>{"passkey", "multikey", "multivalue", "vt"}));
  check_heatmap_png(dir / "out/synthetic.png", h);
  const Json j = parse_json(read_file(dir / "out/summary.json"), "summary.json");
  for (const char* n : names) EXPECT_EQ(j.at("tasks").at(n).at("cells").as_int(), 3) << n;
}

TEST(NeedleSweep, PromptsDependOnTheSeedAndTheCellOnly) {
  eval::NeedleOptions o = small_options("unused", test_seed());
  const auto tok = data::load_tokenizer(o.tokenizer);
  const eval::PromptBuilder b(*tok, o.task);
  const std::vector<uint32_t> hay = tok->encode(haystack_text(test_seed(), 200));
  const std::vector<uint32_t> noise = b.noise_haystack(o.max_context);
  auto tokens = [&](const eval::NeedleOptions& x, Task t, int64_t L, size_t d) {
    std::vector<std::vector<int32_t>> v;
    for (const eval::Prompt& p : eval::cell_prompts(x, b, hay, noise, t, L, d)) v.push_back(p.tokens);
    return v;
  };
  for (Task t : {Task::Needle, Task::VariableTracking, Task::Passkey}) {
    EXPECT_EQ(tokens(o, t, 400, 1), tokens(o, t, 400, 1));
    eval::NeedleOptions o2 = o;
    o2.seed = o.seed + 1;
    EXPECT_NE(tokens(o, t, 400, 1), tokens(o2, t, 400, 1));
    EXPECT_NE(tokens(o, t, 400, 1), tokens(o, t, 600, 1));
  }
  EXPECT_NE(tokens(o, Task::Needle, 400, 1), tokens(o, Task::Needle, 400, 2));
}

// --plan plans for longest_prompt_tokens: no prompt of the sweep is longer (every task, every
// cell of a fresh random grid with distractors, keys, values and hops), and it is within the
// fixed part's 16-token margin plus a few tens of tokens of the longest one built.
TEST(NeedleSweep, LongestPromptBoundsEveryPrompt) {
  std::mt19937_64 r(test_seed());
  eval::NeedleOptions o = small_options("unused", test_seed());
  o.tasks = {Task::Needle, Task::Passkey, Task::MultiKey, Task::MultiValue, Task::VariableTracking};
  o.task.distractors = static_cast<int>(r() % 3);
  o.task.digits = 3 + static_cast<int>(r() % 5);
  o.min_context = 100 + static_cast<int64_t>(r() % 100);
  o.max_context = o.min_context + 300;
  o.context_interval = 150;
  o.depth_interval = 0.25;
  o.samples = 3;
  const auto tok = data::load_tokenizer(o.tokenizer);
  const eval::PromptBuilder b(*tok, o.task);
  const std::vector<uint32_t> hay = tok->encode(haystack_text(test_seed(), 400));
  const std::vector<uint32_t> noise = b.noise_haystack(o.max_context);
  ASSERT_GE(static_cast<int64_t>(hay.size()), o.max_context);
  const int64_t bound = eval::longest_prompt_tokens(o, *tok);
  int64_t longest = 0;
  for (Task t : o.tasks)
    for (int64_t L : eval::context_lengths(o))
      for (size_t d = 0; d < (t == Task::Needle ? eval::needle_depths(o).size() : 1); ++d)
        for (const eval::Prompt& p : eval::cell_prompts(o, b, hay, noise, t, L, d))
          longest = std::max(longest, static_cast<int64_t>(p.tokens.size()));
  std::printf("longest prompt %lld, planned %lld (distractors %d, digits %d)\n", static_cast<long long>(longest),
              static_cast<long long>(bound), o.task.distractors, o.task.digits);
  EXPECT_GE(bound, longest);
  EXPECT_LE(bound, longest + 64);  // (the draws vary the fixed part by a few tens of tokens)
}

// A grid of fresh random scores (one cell without data) drawn, written and read back: every
// cell's pixels are its heat colour, the colour gives the score back (to 1/255 of the scale's
// steps), rows are the depths from 0 at the top, columns the lengths from the shortest.
TEST(NeedleHeatmap, PngEncodesTheScores) {
  std::mt19937_64 rng(test_seed());
  eval::SweepResult r;
  const int64_t lengths[] = {1000, 2000, 4000, 8000, 16000};
  const double depths[] = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
  for (int64_t L : lengths)
    for (double d : depths) {
      eval::CellResult c;
      c.context = L;
      c.depth = d;
      c.samples = 1 + static_cast<int64_t>(rng() % 20);
      c.correct = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.samples + 1));
      r.cells.push_back(c);
    }
  r.cells.erase(r.cells.begin() + 7);  // L=2000 depth 0.2: no data
  const eval::HeatmapImage h = eval::needle_heatmap(r, "random scores");
  EXPECT_EQ(h.y_ticks, (std::vector<std::string>{"0", "20", "40", "60", "80", "100"}));
  EXPECT_EQ(h.x_ticks, (std::vector<std::string>{"1000", "2000", "4000", "8000", "16000"}));
  TempDir dir("needle-heat");
  eval::write_png(dir / "h.png", eval::draw_heatmap(h));
  check_heatmap_png(dir / "h.png", h);
  const eval::Canvas img = eval::read_png(dir / "h.png");
  const eval::HeatmapGeometry g = eval::heatmap_geometry(h);
  EXPECT_EQ(g.rows, 6);
  EXPECT_EQ(g.cols, 5);
  EXPECT_GT(g.cell_h, 1);
  for (const eval::CellResult& c : r.cells) {
    const int row = static_cast<int>(std::find(std::begin(depths), std::end(depths), c.depth) - std::begin(depths));
    const int col =
        static_cast<int>(std::find(std::begin(lengths), std::end(lengths), c.context) - std::begin(lengths));
    const eval::Rgb px = img.pixel(g.left + col * g.cell_w + g.cell_w / 2, g.top + row * g.cell_h + g.cell_h / 2);
    EXPECT_NEAR(score_of(px), c.score(), 0.011) << "L " << c.context << " depth " << c.depth;
  }
  EXPECT_EQ(score_of(img.pixel(g.left + g.cell_w + 1, g.top + g.cell_h + 1)), -1) << "the cell without data";
  // The colour bar right of the grid: 1 (green) at the top, 0 (red) at the bottom.
  const int bar = g.left + g.cols * g.cell_w + 30;
  EXPECT_EQ(img.pixel(bar, g.top), eval::rgb("#0CD79F"));
  EXPECT_EQ(img.pixel(bar, g.top + g.rows * g.cell_h - 1), eval::rgb("#F0496E"));
  // Tick labels left of the rows and under the columns: ink there, not in the cells' colours.
  for (int row = 0; row < g.rows; ++row) {
    int ink = 0;
    for (int y = g.top + row * g.cell_h; y < g.top + (row + 1) * g.cell_h; ++y)
      for (int x = 0; x < g.left - 4; ++x) ink += img.pixel(x, y) == eval::Rgb{0x22, 0x22, 0x22};
    EXPECT_GT(ink, 10) << "no tick label for row " << row;
  }
}

TEST(NeedleHeatmap, HeatColoursAreEasyContexts) {
  EXPECT_EQ(eval::heat_rgb(0.0), (eval::Rgb{0xF0, 0x49, 0x6E}));
  EXPECT_EQ(eval::heat_rgb(0.5), (eval::Rgb{0xEB, 0xB8, 0x39}));
  EXPECT_EQ(eval::heat_rgb(1.0), (eval::Rgb{0x0C, 0xD7, 0x9F}));
  EXPECT_EQ(eval::heat_rgb(0.25), eval::rgb(report::heat_colour(0.25)));
  EXPECT_EQ(eval::heat_rgb(std::nan("")), (eval::Rgb{0xDD, 0xDD, 0xDD}));
  eval::HeatmapImage h;
  h.x_ticks = {"1", "2"};
  h.y_ticks = {"a"};
  h.value = {{1.0}};
  EXPECT_THROW(eval::draw_heatmap(h), Error);
}

TEST(NeedleProgress, LinesNameCellsRateAndEta) {
  eval::SweepProgress p;
  p.cells_done = 22;
  p.cells_total = 110;
  p.prompts_done = 220;
  p.prompts_total = 1100;
  p.tokens = 1200000;
  p.work_done = 1e6;
  p.work_total = 5e6;
  p.seconds = 52;
  EXPECT_DOUBLE_EQ(p.eta(), 208);
  EXPECT_EQ(eval::format_sweep_progress(p),
            "cells 22/110, prompts 220/1100, 1.20M tokens, 23.1K tok/s, elapsed 52.0s, ETA 3m28s");
  p.cells_done = 110;
  p.prompts_done = 1100;
  p.work_done = p.work_total;
  EXPECT_EQ(eval::format_sweep_progress(p).find("ETA"), std::string::npos);
  p = {};
  EXPECT_EQ(p.eta(), -1);
}

TEST(NeedleFlags, EasyContextsFlagsDashed) {
  const char* argv[] = {"easyctx_eval_needle",
                        "--model",
                        "m",
                        "--tokenizer",
                        "t.model",
                        "--output-dir",
                        "o",
                        "--min-context-length",
                        "1000",
                        "--max-context-length",
                        "8000",
                        "--context-interval",
                        "1000",
                        "--depth-interval",
                        "0.2",
                        "--samples",
                        "3",
                        "--distractors",
                        "2",
                        "--digits",
                        "6",
                        "--seed",
                        "7",
                        "--rope-theta",
                        "500000",
                        "--device",
                        "cpu",
                        "--sp-size",
                        "2",
                        "--sp-mode",
                        "ulysses",
                        "--task",
                        "needle,passkey,vt",
                        "--ulysses-size",
                        "2",
                        "--progress-every",
                        "5",
                        "--collective-timeout-s",
                        "99"};
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
  EXPECT_EQ(o.session.ulysses_size, 2);
  EXPECT_EQ(o.progress_every, 5);
  EXPECT_EQ(o.session.collective_timeout_s, 99);
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
    } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what(); }
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
  expect_flag({"--progress-every", "-1"}, "--progress-every");
  expect_flag({"--digits", "30"}, "--digits");
  expect_flag({"--samples", "three"}, "samples");
  expect_flag({"--no-such-flag"}, "no-such-flag");
  std::vector<const char*> argv{"x", "--tokenizer", "t", "--output-dir", "o"};
  eval::NeedleOptions o;
  try {
    eval::parse_needle_flags(static_cast<int>(argv.size()), argv.data(), o, nullptr);
    ADD_FAILURE();
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what(); }
}

// The whole program after the flags (the session, the tokenizer file, the haystack, the
// model's vocabulary and BOS checked, outputs, progress), with the CI tokenizer.
TEST(NeedleRun, ChecksTheTokenizerAgainstTheModel) {
  TempDir dir("needle-run");
  std::filesystem::create_directories(dir / "hay");
  write_file_atomic(dir / "hay/a.txt", haystack_text(test_seed(), 300));
  eval::NeedleOptions o = small_options(dir / "out", test_seed());
  o.haystack_dir = dir / "hay";
  o.tasks = {Task::Needle, Task::Passkey};
  const eval::SweepResult r = eval::run_needle(o, self_comm());
  EXPECT_EQ(r.cells.size(), 15u + 3u);
  EXPECT_TRUE(std::filesystem::exists(dir / "out/needle.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/synthetic.png"));
  const Json j = parse_json(read_file(dir / "out/summary.json"), "summary.json");
  EXPECT_NE(j.at("haystack").as_string().find("1 document(s) from 1 file(s)"), std::string::npos);
  o.session.model = "random:tiny@1";  // vocabulary 256 < the tokenizer's 2000
  try {
    eval::run_needle(o, self_comm());
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace easyctx::test
