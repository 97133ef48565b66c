// An evaluation session: a model loaded once for forward-only passes (no gradients, no
// optimizer, no activation checkpoints), on the CPU (fp32) or a GPU (bf16 weights, fp32
// accumulation), over one rank or a sequence-parallel group (every mode of
// parallel.sequence.mode under mpirun), with data parallelism over whole items (documents,
// needle cells) on top. Every evaluation tool scores through it:
//   easyctx_eval_ppl     per-token NLL of a document's prefix            -> score_spans
//   easyctx_eval_needle  whether every answer token is the argmax under  -> score_spans
//                        teacher forcing (EasyContext's protocol)
// Any prompt length: the session pads inside (the padded positions are never scored and
// never seen by a real token: causal attention) and never changes the caller's tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "dist/comm.h"

namespace easyctx::eval {

struct ModelRef;  // eval/model_source.h

// Where a score_spans call stands (every rank gets the same values, after each round: every
// data-parallel group has finished one more item). Tokens are the items' real tokens.
struct ScoreProgress {
  int64_t items_done = 0, items_total = 0;
  int64_t tokens_done = 0, tokens_total = 0;
  double elapsed_s = 0;  // since the call began
};
// "items 12/40, 1.20M/4.00M tokens, 23.1K tok/s, ETA 2m01s" (the ETA assumes the remaining
// tokens go at the rate so far; items run longest first, so it errs long).
std::string format_progress(const ScoreProgress& p);

struct SessionOptions {
  // The model: a Hugging Face folder (config.json + safetensors), or "ckpt:DIR" (a training
  // checkpoint: a step folder, a checkpoints folder or a run's output.dir; any ZeRO stage or
  // rank count).
  std::string model;
  // `model` as the program already resolved it (resolve_model: a checkpoint found and
  // verified), or null: open_session resolves it, collectively over its world. Programs resolve
  // where they check their flags and pass it on, so that a checkpoint is verified once per job
  // (each file by one rank), not again by the plan and the session on every rank.
  std::shared_ptr<const ModelRef> resolved;
  DeviceKind device = DeviceKind::Auto;  // --device auto|cpu|cuda
  double rope_theta = 0;                 // > 0 overrides the model's
  // Sequence parallelism over the ranks of the job (1: every rank evaluates its own items).
  SeqParallelMode sp_mode = SeqParallelMode::ZigzagRing;
  int sp_size = 1;
  int ulysses_size = 0;               // usp: the Ulysses degree inside a group (0: ranks per node)
  int64_t attention_head_groups = 1;  // attention in passes over head groups
  int64_t mlp_tile = 16384;           // tokens per MLP tile (0: untiled)
  int64_t lm_head_tile = 4096;        // tokens per LM-head tile
  double collective_timeout_s = 600;
  // Called on every rank after each round of score_spans (optional).
  std::function<void(const ScoreProgress&)> progress;
};

// One item to score: `tokens` (the whole input, BOS included where the model expects it);
// spans [begin, begin + length) of positions whose NEXT token is scored, i.e. the prediction
// at position p is compared with tokens[p + 1] (so begin + length <= tokens.size() - 1).
struct ScoreRequest {
  std::vector<int32_t> tokens;
  struct Span {
    int64_t begin = 0, length = 0;
  };
  std::vector<Span> spans;
};

struct SpanScore {
  double sum_nll = 0;       // sum over the span's predictions of -log p(next token)
  int64_t count = 0;        // predictions in the span
  bool all_argmax = false;  // every next token of the span is the model's argmax
                            // (a span of length 0: count 0, sum 0, all_argmax true)
};

// What a session has used and done, this rank (for --plan's comparison and summaries).
struct SessionStats {
  int64_t alloc_peak_bytes = 0;   // the backend's allocation high-water mark (weights included)
  int64_t weight_bytes = 0;       // the model's weights as the backend holds them
  double device_used_bytes = -1;  // CUDA: the most device memory in use seen after an item (cudaMemGetInfo)
  int64_t items = 0, tokens = 0;  // scored by this session's score_spans calls (the whole job's)
  double seconds = 0;             // spent in score_spans
};

class Session {
 public:
  virtual ~Session() = default;
  // Collective over the job: every rank calls with the same requests (in the same order);
  // each request is scored once (by one data-parallel group), every rank returns every
  // request's scores, one per span in order.
  virtual std::vector<std::vector<SpanScore>> score_spans(const std::vector<ScoreRequest>& requests) = 0;
  // The model's vocabulary, context length it was configured for, BOS/EOS ids.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t bos_id() const = 0;
  // Where it runs: "cpu" or the GPU's name; ranks, sequence-parallel size, data-parallel groups.
  virtual std::string describe() const = 0;
  virtual SessionStats stats() const { return {}; }
};

// Flag values: --device auto|cpu|cuda, --sp-mode zigzag_ring|ulysses|dist_flash|usp;
// InputError naming the flag and the choices.
DeviceKind parse_device(const std::string& value, const std::string& flag = "--device");
SeqParallelMode parse_sp_mode(const std::string& value, const std::string& flag = "--sp-mode");

// The checks open_session makes of the options before it touches a file or a device, for a
// job of world_size ranks (InputError naming the flag): programs call it on every rank first.
void validate_session_options(const SessionOptions& o, int world_size);

// The stage config a session's strategies and process groups are made from
// (parallel.sequence.*, activation.attention_head_groups, mlp_tile, lm_head_tile, the
// collective timeout); the memory plan plans the same.
StageConfig session_config(const SessionOptions& o);

// A progress callback that logs format_progress(p) after `what` on the world's rank `rank` == 0,
// at most every `every_s` seconds, and always the last round.
std::function<void(const ScoreProgress&)> log_progress(const std::string& what, int rank, double every_s = 30);

// Loads the model (collective over `world`; a checkpoint not resolved in o.resolved is verified
// with each file checked by one of world's ranks): InputError naming the folder, file, or flag.
// `world` is a host MPI communicator (dist::MpiComm, e.g. over MPI_COMM_WORLD or part of it):
// the session splits its ranks into world = dp x sp groups (sequence-parallel groups of
// consecutive ranks, NCCL communicators on CUDA) and gathers results over it.
std::unique_ptr<Session> open_session(const SessionOptions& o, dist::Comm& world);

}  // namespace easyctx::eval
