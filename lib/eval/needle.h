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
// Under mpirun the session's data-parallel groups share a length's cells (and their samples);
// each prompt is split over --sp-size ranks.
//
// Outputs in --output-dir (rank 0):
//   needle.csv      context,depth,score,samples       (easyctx_report reads it)
//   needle.png      the heatmap: depth down, context length across
//   synthetic.csv   task,context,score,samples
//   synthetic.png   the heatmap: task down, context length across
//   summary.json    averages per task (accuracy, answer NLL), cells, tokens, seconds, settings
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eval/haystack.h"
#include "eval/heatmap.h"
#include "eval/retrieval.h"
#include "eval/session.h"

namespace easyctx::eval {

struct NeedleOptions {
  SessionOptions session;    // --model, --device, --rope-theta, --sp-size, --sp-mode, tiles
  std::string tokenizer;     // --tokenizer: SentencePiece .model or tokenizer.json
  std::string haystack_dir;  // --haystack-dir ("": the King James Bible, eval/haystack.h)
  std::string output_dir;    // --output-dir
  std::string tensorboard;   // --tensorboard: event files' folder ("": <output-dir>/tensorboard; "none": none)
  // EasyContext's eval_needle.py spellings are accepted too (--num_samples, --haystack_dir, ...;
  // parse_needle_flags rewrites them).
  std::vector<Task> tasks{Task::Needle};  // --task a,b,...
  int64_t min_context = 1000;             // --min-context-length
  int64_t max_context = 100000;           // --max-context-length
  int64_t context_interval = 1000;        // --context-interval
  std::vector<int64_t> context_list;      // --context-lengths a,b,...: these lengths instead (ascending)
  double depth_interval = 0.1;            // --depth-interval
  int samples = 10;                       // --samples
  uint64_t seed = 24242424;               // --seed (EasyContext's)
  TaskOptions task;                       // --digits, --distractors, --keys, --values, --hops
  double progress_every = 30;             // --progress-every: seconds between progress lines
  bool plan = false;                      // --plan: print the memory plan of the longest prompt, exit
  bool print_sweep = false;               // --print-sweep: print the resolved options (describe_needle_options), exit
  std::vector<std::string> plan_sets;     // --set target.KEY=VALUE: the machine --plan plans for
};

// Parses the command line (argv[0] is the program). Returns false after writing the help to
// *help when --help is given. Throws InputError naming the flag.
bool parse_needle_flags(int argc, const char* const* argv, NeedleOptions& o, std::string* help);
void check_needle_options(const NeedleOptions& o);  // InputError naming the flag
// --tokenizer's default: tokenizer.model, else tokenizer.json, in the model's folder (a run's
// output.dir: its final/); InputError naming --tokenizer for ckpt:DIR or a folder with neither.
std::string default_needle_tokenizer(const std::string& model_spec);
// --output-dir's default: data/needle_<the model folder's name>.
std::string default_needle_output_dir(const std::string& model_spec);

// The resolved options, a "name: value" line each (--print-sweep; nothing is loaded).
std::string describe_needle_options(const NeedleOptions& o);

// The lengths swept: --context-lengths when given, else min, min + interval, ... <= max.
std::vector<int64_t> context_lengths(const NeedleOptions& o);
// Tokens of the longest prompt the sweep can build: the last context length plus the largest
// fixed part (prefix, needles or keys, question, answer) of any of its tasks, drawn over many
// draws with a margin of 16 tokens (city names and distractors vary); what --plan plans for.
int64_t longest_prompt_tokens(const NeedleOptions& o, const data::Tokenizer& tok);
std::vector<double> needle_depths(const NeedleOptions& o);

struct CellResult {
  Task task = Task::Needle;
  int64_t context = 0;
  double depth = 0;  // needle only (NaN for the synthetic tasks)
  int64_t correct = 0, samples = 0;
  int64_t tokens = 0;         // prompt tokens scored
  double answer_nll = 0;      // the answers' NLL summed over the samples (nats)
  int64_t answer_tokens = 0;  // the answers' tokens summed over the samples
  double score() const { return samples ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0; }
  double mean_answer_nll() const { return answer_tokens ? answer_nll / static_cast<double>(answer_tokens) : 0.0; }
};

struct SweepResult {
  std::vector<CellResult> cells;  // by task (in --task order), then context, then depth
  int64_t tokens = 0;
  double seconds = 0;
  double average(Task t) const;  // mean of the task's cell scores (NaN without cells)
};

// Where a sweep is. Cells are scored a length at a time (every cell of a length, all tasks,
// in one Session::score_spans call, so data-parallel groups share the cells); prompts and
// tokens move inside a call as the session reports its rounds.
struct SweepProgress {
  int64_t cells_done = 0, cells_total = 0;
  int64_t prompts_done = 0, prompts_total = 0;
  int64_t tokens = 0;                    // prompt tokens scored so far
  double work_done = 0, work_total = 0;  // haystack tokens (L per prompt): what the ETA goes by
  double seconds = 0;                    // since the sweep started
  double eta() const;                    // seconds left at the rate so far (-1 before any work)
};
// "cells 22/110, prompts 220/1100, 1.20M tokens, 23.1K tok/s, elapsed 52.0s, ETA 3m28s"
std::string format_sweep_progress(const SweepProgress& p);
// Called on every rank: after each call with the cells it finished (in order), and between a
// call's rounds with `finished` empty (when the session relays its progress: SweepRelay).
using SweepProgressFn = std::function<void(const SweepProgress&, const std::vector<CellResult>& finished)>;
// The default: on rank 0, a line per finished length ("needle L=4000: depth 0 1.00, 0.5
// 0.80, ...; cells ...") and within long calls a progress line at most every `every_s` seconds.
SweepProgressFn log_sweep_progress(int rank, double every_s = 30);

// SessionOptions::progress for a session that sweeps will use (set it before open_session):
// run_sweep points it at its own progress for the duration of each score_spans call.
struct SweepRelay {
  std::shared_ptr<std::function<void(const ScoreProgress&)>> target =
      std::make_shared<std::function<void(const ScoreProgress&)>>();
  std::function<void(const ScoreProgress&)> callback() const {
    auto t = target;
    return [t](const ScoreProgress& p) {
      if (*t) (*t)(p);
    };
  }
};

// The prompts of one cell as run_sweep scores them: o.samples prompts of task t at length L
// (the needle at needle_depths(o)[depth_index], holding the numbers drawn once from o.seed,
// the same in every cell; the synthetic tasks over `noise`, b.noise_haystack(o.max_context)),
// every draw from o.seed and the cell.
std::vector<Prompt> cell_prompts(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack,
                                 const std::vector<uint32_t>& noise, Task t, int64_t L, size_t depth_index);

// The sweep over o's grid: every rank calls it (Session::score_spans is collective); every
// rank returns the same result.
SweepResult run_sweep(const NeedleOptions& o, const PromptBuilder& b, const std::vector<uint32_t>& haystack, Session& s,
                      const SweepProgressFn& progress = nullptr, const SweepRelay* relay = nullptr);

std::string needle_csv(const SweepResult& r);     // header "context,depth,score,samples"
std::string synthetic_csv(const SweepResult& r);  // header "task,context,score,samples"
HeatmapImage needle_heatmap(const SweepResult& r, const std::string& title);
HeatmapImage synthetic_heatmap(const SweepResult& r, const std::string& title);
// TensorBoard events of the sweep (docs/eval.md) in a new event file in `dir` (created): per
// context length one event, step = the length, holding eval_needle/<label>/<task> = the
// task's accuracy at that length (needle: the mean over its depths, in the CSV's order) and,
// for the needle task, eval_needle/<label>/needle_depth_<percent> per depth. Returns its path.
std::string write_needle_events(const std::string& dir, const std::string& label, const SweepResult& r,
                                const std::vector<Task>& tasks);
// Writes the outputs listed above into o.output_dir (created if needed), and the TensorBoard
// events into o.tensorboard's folder.
void write_needle_outputs(const NeedleOptions& o, const SweepResult& r, const std::string& session_description,
                          const std::string& haystack_description);

// The whole program after flag parsing (collective over `world`): opens the session, loads
// the tokenizer and the haystack, checks them against the model (vocabulary, BOS), runs the
// sweep with progress lines, writes the outputs (rank 0) and logs a summary line. `haystack`:
// the needle task's haystack when the caller loaded it already (load_haystack over `world`,
// as easyctx_eval_needle does where its errors end every rank alike), else null: loaded here
// the same way (rank 0 reads and tokenizes, every rank gets the ids).
SweepResult run_needle(const NeedleOptions& o, dist::Comm& world, const Haystack* haystack = nullptr);

}  // namespace easyctx::eval
