// Perplexity sweep over document lengths (easyctx_eval_ppl; docs/eval.md).
//
// For each length L in min_tokens, min_tokens + step, ..., max_tokens: take the first K
// documents (storage order: shard files sorted by name, documents in file order) that have
// at least L tokens; score each document's first L tokens as stored (BOS first), i.e. the
// L - 1 next-token predictions of one causal pass; document NLL = mean over those
// predictions; ppl(L) = exp(mean over the documents of their NLL). With equal-length
// documents this equals the token-weighted value and YaRN's --truncate mode.
//
// One forward pass per document at its largest selected L serves every shorter L (causal
// attention: a prefix's predictions do not depend on later tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace easyctx::eval {

struct PplOptions {
  std::string model_dir;              // HF folder (config.json + safetensors), or a run's output.dir (its final/)
  std::vector<std::string> tokenized; // shard files, folders or globs (h5tokenize output)
  int64_t min_tokens = 0;
  int64_t max_tokens = 0;
  int64_t tokens_step = 0;
  int64_t samples = -1;               // K; -1: every qualifying document
  int64_t lm_head_tile = 4096;
  int64_t mlp_tile = 16384;           // tokens per MLP tile (0: untiled): the [tokens, I] activations
  double rope_theta = 0;              // > 0 overrides the model's
};

struct PplRow {
  int64_t tokens = 0;    // L
  int64_t documents = 0; // documents scored at L
  double mean_nll = 0;   // mean over documents of the per-document mean NLL
  double ppl = 0;        // exp(mean_nll); NaN when no document has L tokens
};

// Validates options (InputError naming the flag). `comm` (may be null) splits documents
// across ranks; every rank returns the same rows.
std::vector<PplRow> evaluate_perplexity(const PplOptions& opts, dist::Comm* comm);

// The Hugging Face folder --model names: DIR itself when it has config.json, else a training
// run's export DIR/final; InputError saying what DIR is otherwise.
std::string resolve_model_dir(const std::string& dir);

// CSV: header "tokens,ppl,documents,nll", one row per length.
std::string ppl_csv(const std::vector<PplRow>& rows);

}  // namespace easyctx::eval
