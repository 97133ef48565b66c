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
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "dist/comm.h"

namespace easyctx::eval {

struct SessionOptions {
  // The model: a Hugging Face folder (config.json + safetensors), or "ckpt:DIR" (a training
  // checkpoint: a step folder, a checkpoints folder or a run's output.dir; any ZeRO stage or
  // rank count).
  std::string model;
  DeviceKind device = DeviceKind::Auto;  // --device auto|cpu|cuda
  double rope_theta = 0;                 // > 0 overrides the model's
  // Sequence parallelism over the ranks of the job (1: every rank evaluates its own items).
  SeqParallelMode sp_mode = SeqParallelMode::ZigzagRing;
  int sp_size = 1;
  int64_t attention_head_groups = 1;  // attention in passes over head groups
  int64_t mlp_tile = 16384;           // tokens per MLP tile (0: untiled)
  int64_t lm_head_tile = 4096;        // tokens per LM-head tile
  double collective_timeout_s = 600;
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
  double sum_nll = 0;        // sum over the span's predictions of -log p(next token)
  int64_t count = 0;         // predictions in the span
  bool all_argmax = false;   // every next token of the span is the model's argmax
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
};

// Loads the model (collective over `world`): InputError naming the folder, file, or flag.
std::unique_ptr<Session> open_session(const SessionOptions& o, dist::Comm& world);

}  // namespace easyctx::eval
