// Perplexity sweep over document lengths (easyctx_eval_ppl; docs/eval.md).
//
// For each length L in min_tokens, min_tokens + step, ..., max_tokens: take the first K
// documents (storage order: shard files sorted by name, documents in file order) that have
// at least L tokens; score each document's first L tokens as stored (BOS first), i.e. the
// L - 1 next-token predictions of one causal pass; document NLL = mean over those
// predictions; ppl(L) = exp(mean over the documents of their NLL). With equal-length
// documents this equals the token-weighted value and YaRN's --truncate mode.
//
// EasyContext's document set and windows (eval_ppl.py), when any of dataset_min_tokens,
// truncate or sliding_window is set: the documents are fixed, the first K (samples) of those
// with at least dataset_min_tokens tokens, the same at every length. A document's tokens
// are its stored ones after a leading BOS; each window is BOS + a slice of them, as
// EasyContext prepends BOS. With truncate, one window per document: its first L - 1 tokens
// (all of them when it is shorter), the mean NLL of its predictions is the document's; with
// a sliding window (stride S, 256 by default) windows of up to L - 1 tokens start every S
// tokens and score only the tokens the previous window did not (Hugging Face's strided
// perplexity, as EasyContext). ppl(L) = exp(mean over windows of their mean NLL). A window's
// NLL is the exact mean over its predictions (EasyContext: the mean over ranks of each rank's
// mean, equal up to the shards' uneven target counts).
//
// One forward pass per document at its largest selected L serves every shorter L (causal
// attention: a prefix's predictions do not depend on later tokens): the document is one
// request of the evaluation session (session.h) with one span per selected length, so the
// sweep runs on the CPU or a GPU, sequence parallel and data parallel as the session does.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "eval/plot.h"
#include "eval/session.h"

namespace easyctx::eval {

struct PplOptions {
  std::string model_dir;  // HF folder (config.json + safetensors), a run's output.dir (its final/), or ckpt:DIR
  std::vector<std::string> tokenized;  // shard files, folders or globs (h5tokenize output)
  int64_t min_tokens = 0;
  int64_t max_tokens = 0;
  int64_t tokens_step = 0;  // 0: lengths double from min_tokens while <= max_tokens (EasyContext)
  int64_t samples = -1;     // K; -1: every qualifying document
  // EasyContext's document set and windows (above); any of these three set selects them.
  int64_t dataset_min_tokens = -1;  // documents of at least this many tokens (-1: not given)
  bool truncate = false;            // one window per document: its first L - 1 tokens after BOS
  int64_t sliding_window = 0;       // stride of the windows without truncate (0: not given; 256 then)
  int64_t lm_head_tile = 4096;
  int64_t mlp_tile = 16384;  // tokens per MLP tile (0: untiled): the [tokens, I] activations
  double rope_theta = 0;     // > 0 overrides the model's
  // Where and how (the session's options; model, rope_theta and the tiles above win over
  // theirs). The library's default device is the CPU; easyctx_eval_ppl's --device is auto.
  DeviceKind device = DeviceKind::Cpu;
  SeqParallelMode sp_mode = SeqParallelMode::ZigzagRing;
  int sp_size = 1;
  int ulysses_size = 0;
  int64_t attention_head_groups = 1;
  double collective_timeout_s = 600;
  std::function<void(const ScoreProgress&)> progress;  // optional, every rank
  // Models the program already resolved (resolve_model: checkpoints verified), by --model spec;
  // the others are resolved (collectively over the comm) by evaluate_perplexity_models. Every
  // model is resolved once per call: its plan, label and session share it.
  std::map<std::string, std::shared_ptr<const ModelRef>> resolved;
  // Refuse (InputError naming the length and the longest document) a length no document
  // reaches, before any forward pass, instead of returning its row with ppl NaN.
  // easyctx_eval_ppl sets it: its CSV never holds a nan row.
  bool require_every_length = false;
};

// Whether o selects EasyContext's document set and windows.
bool easycontext_documents(const PplOptions& o);
// The lengths of the sweep: min, min + step, ... <= max; without a step, min, 2 min, 4 min, ...
// <= max (EasyContext's eval_ppl.py).
std::vector<int64_t> ppl_lengths(const PplOptions& o);

struct PplRow {
  int64_t tokens = 0;     // L
  int64_t documents = 0;  // documents scored at L
  double mean_nll = 0;    // mean over documents of the per-document mean NLL (EasyContext's
                          // windows: over windows of the window's mean NLL)
  double ppl = 0;         // exp(mean_nll); NaN when no document has L tokens (and
                          // require_every_length is off); a non-finite loss is an InputError
};

// One model's sweep.
struct PplResult {
  std::string model;  // as given
  std::string label;  // short name for tables and the plot (unique among the models)
  std::vector<PplRow> rows;
  SessionStats stats;    // rank 0's
  std::string describe;  // where it ran (Session::describe)
};

// Validates options (InputError naming the flag). `comm` (may be null: this process alone)
// is the job's ranks: world = data-parallel groups x sp_size; every rank returns the same rows.
std::vector<PplRow> evaluate_perplexity(const PplOptions& opts, dist::Comm* comm);
// Several models one after another on the same documents (opts.model_dir is ignored).
std::vector<PplResult> evaluate_perplexity_models(const PplOptions& opts, const std::vector<std::string>& models,
                                                  dist::Comm* comm);

// CSV: header "tokens,ppl,documents,nll", one row per length.
std::string ppl_csv(const std::vector<PplRow>& rows);
// Several models in one CSV: header "model,tokens,ppl,documents,nll" (model: the label).
std::string ppl_csv(const std::vector<PplResult>& results);
// What a sweep would score, without loading any weights (easyctx_eval_ppl --print-sweep):
// the lengths, the documents chosen, the windows and tokens, a "name: value" line each. The
// first model's config.json gives the vocabulary and BOS the documents are checked against.
std::string describe_ppl_sweep(const PplOptions& opts, const std::vector<std::string>& models, dist::Comm* comm);

// EasyContext's CSV (eval_ppl.py; its plot.py and YaRN's read it): header ",L1,L2,...", then
// one row per model: the model as given, then its perplexity at each length.
std::string ppl_csv_wide(const std::vector<PplResult>& results);
// Perplexity against context length, one series per model (a log2 x axis when the lengths
// are not evenly spaced and span a factor of 8 or more).
LineChart ppl_chart(const std::vector<PplResult>& results);
// TensorBoard events of the sweep (docs/eval.md) in a new event file in `dir` (created):
// per length one event, step = the length in tokens, holding eval_ppl/<label> = the
// perplexity of each model (float32). Returns the file's path.
std::string write_ppl_events(const std::string& dir, const std::vector<PplResult>& results);
// The session options of a sweep (the plan and the sweep use the same).
SessionOptions session_options(const PplOptions& opts, const std::string& model);

}  // namespace easyctx::eval
