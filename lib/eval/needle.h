// easyctx_eval_needle: EasyContext's needle-in-a-haystack sweep and RULER-style synthetic
// retrieval tasks, scored through an eval::Session (docs/eval.md).
//
// Needle: for every context length L in min, min + interval, ..., <= max and every depth in
// 0, d, 2d, ..., <= 1 (d = --depth-interval), `samples` prompts (eval/retrieval.h), one per
// number of a list drawn once from --seed (the same numbers in every cell, as EasyContext);
// a cell's score = the fraction whose answer is reproduced exactly under teacher forcing.
// Synthetic tasks: `samples` prompts per (task, L), every draw (key, value, depth) from the
// seed and the cell. Results do not depend on the number of ranks or the device.
//
// Outputs in --output-dir (rank 0):
//   needle.csv      context,depth,score,samples       (easyctx_report reads it)
//   needle.png      the heatmap: depth down, context length across
//   synthetic.csv   task,context,score,samples
//   synthetic.png   the heatmap: task down, context length across
//   summary.json    averages per task, cells, tokens, seconds, the settings
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eval/heatmap.h"
#include "eval/retrieval.h"
#include "eval/session.h"

namespace easyctx::eval {

struct NeedleOptions {
  SessionOptions session;     // --model, --device, --rope-theta, --sp-size, --sp-mode, tiles
  std::string tokenizer;      // --tokenizer: SentencePiece .model or tokenizer.json
  std::string haystack_dir;   // --haystack-dir ("": the King James Bible, eval/haystack.h)
  std::string output_dir;     // --output-dir
  std::vector<Task> tasks{Task::Needle};  // --task a,b,...
  int64_t min_context = 1000;       // --min-context-length
  int64_t max_context = 100000;     // --max-context-length
  int64_t context_interval = 1000;  // --context-interval
  double depth_interval = 0.1;      // --depth-interval
  int samples = 10;                 // --samples
  uint64_t seed = 24242424;         // --seed (EasyContext's)
  TaskOptions task;                 // --digits, --distractors, --keys, --values, --hops
};

// Parses the command line (argv[0] is the program). Returns false after writing the help to
// *help when --help is given. Throws InputError naming the flag.
bool parse_needle_flags(int argc, const char* const* argv, NeedleOptions& o, std::string* help);
void check_needle_options(const NeedleOptions& o);  // InputError naming the flag

std::vector<int64_t> context_lengths(const NeedleOptions& o);
std::vector<double> needle_depths(const NeedleOptions& o);

struct CellResult {
  Task task = Task::Needle;
  int64_t context = 0;
  double depth = 0;          // needle only
  int64_t correct = 0, samples = 0;
  int64_t tokens = 0;        // prompt tokens scored
  double seconds = 0;
  double score() const { return samples ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0; }
};

struct SweepResult {
  std::vector<CellResult> cells;  // needle cells by (context, depth), then tasks by (task, context)
  int64_t tokens = 0;
  double seconds = 0;
  double average(Task t) const;   // mean of the task's cell scores (NaN without cells)
};

// Where a sweep is, after each cell.
struct SweepProgress {
  size_t done = 0, total = 0;  // cells
  int64_t tokens = 0;          // prompt tokens scored so far
  double seconds = 0;          // since the sweep started
  double eta = 0;              // seconds left, by the haystack tokens left (a cell costs ~ L)
};
using ProgressFn = std::function<void(const CellResult&, const SweepProgress&)>;
// The default: one line per cell on rank 0's log: the cell's result, tokens/s, elapsed, ETA.
ProgressFn log_progress();

// The sweep over o's grid: every rank calls it (Session::score_spans is collective).
SweepResult run_sweep(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack,
                      Session& s, const ProgressFn& progress = log_progress());

std::string needle_csv(const SweepResult& r);     // header "context,depth,score,samples"
std::string synthetic_csv(const SweepResult& r);  // header "task,context,score,samples"
HeatmapImage needle_heatmap(const SweepResult& r, const std::string& title);
HeatmapImage synthetic_heatmap(const SweepResult& r, const std::string& title);
// Writes the outputs listed above into o.output_dir (created if needed).
void write_needle_outputs(const NeedleOptions& o, const SweepResult& r, const std::string& session_description,
                          const std::string& haystack_description);

// The whole program after flag parsing: tokenizer, haystack, checks against the session's
// model (vocabulary, BOS), the sweep, the outputs (rank 0) and a summary line.
SweepResult run_needle(const NeedleOptions& o, Session& s, int rank);

}  // namespace easyctx::eval
