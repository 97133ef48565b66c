// DataLoader: what training calls. Opens the token shards at `data.path`, checks them
// against the model, and returns the micro-batch of (step, micro) for this data-parallel
// rank and this sequence-parallel rank, as int32 arrays ready to copy to the device.
//
//   data::LoaderOptions o;  o.path = cfg.data.path;  o.seq_length = 32768;  o.seed = 42;
//   o.shape = {batch_size, grad_accum, dp_size};  o.dp_rank = ...;
//   o.sp_layout = data::SpLayout::Zigzag;  o.sp_size = W;  o.sp_rank = r;
//   data::DataLoader loader(o);
//   loader.validate(model.vocab_size, cfg.data.tokenizer_sha256);
//   for (...) { data::MicroBatch mb = loader.next(); ... }   // or micro_batch(step, micro)
//   ckpt.save("data_cursor", loader.state().to_json());  ...  loader.restore(LoaderState::from_json(s));
//
// Determinism: micro_batch(step, micro) is a pure function of (seed, dataset, seq_length,
// batch shape, dp_rank, sp layout/rank); see sampler.h for the sample definition.
// Errors: InputError naming the file for unreadable shards, ids >= vocab, bad cursors.
// Not thread-safe (the dataset keeps a small cache of open HDF5 files): one loader per
// thread, e.g. a prefetch thread that owns it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/sp_slice.h"

namespace easyctx::data {

struct LoaderOptions {
  std::string path;        // shard file, folder or glob (TokenDataset)
  int64_t seq_length = 0;  // L: inputs per sequence (a window has L + 1 tokens)
  uint64_t seed = 0;
  BatchShape shape;        // batch_size, grad_accum, dp_size
  int64_t dp_rank = 0;
  SpLayout sp_layout = SpLayout::None;
  int sp_size = 1;
  int sp_rank = 0;
  int sp_inner = 1;        // usp: the Ulysses degree (sp_rank = ring_rank * sp_inner + ulysses_rank)
  int32_t pad_id = 0;      // input id of padding positions (their labels are -1)
  bool check_tokens = true;  // check every window's ids < vocab when drawn (data.check_tokens)
};

struct MicroBatch {
  int64_t step = 0, micro = 0;
  int64_t batch = 0;      // B sequences
  int64_t local_len = 0;  // tokens per sequence on this SP rank (sp_local_length)
  // Row-major [batch, local_len]:
  std::vector<int32_t> tokens, labels, positions;
  int64_t real_labels = 0;             // labels != -1 in this rank's slice (loss denominator part)
  std::vector<uint64_t> sample_ids;    // [batch] global sample indices
};

// The data cursor saved in checkpoints. Resuming needs the same seed, seq_length, dataset
// token count and global batch size; dp_size/grad_accum may change when the global batch
// stays equal and the cursor is at a step boundary.
struct LoaderState {
  uint64_t seed = 0;
  int64_t seq_length = 0;
  int64_t global_batch = 0;
  uint64_t dataset_tokens = 0;
  int64_t next_step = 0;
  int64_t next_micro = 0;
  std::string to_json() const;
  static LoaderState from_json(const std::string& text);  // throws InputError on bad text
  bool operator==(const LoaderState& o) const;
};

class DataLoader {
 public:
  explicit DataLoader(const LoaderOptions& opts);

  // See TokenDataset::validate. Also makes every later window check ids < model_vocab
  // (before validate, ids are checked against the shards' own vocab_size).
  void validate(int64_t model_vocab, const std::string& expected_sha256 = "", bool full_scan = false);

  // Pure: the micro-batch `micro` (0 <= micro < grad_accum) of `step` for this rank.
  MicroBatch micro_batch(int64_t step, int64_t micro) const;
  // Cursor-driven: returns micro_batch(next_step, next_micro) and advances the cursor.
  MicroBatch next();

  // The L + 1 tokens of global sample i.
  std::vector<uint32_t> window(uint64_t sample) const;

  LoaderState state() const;
  // Continues exactly where `s` left off; throws InputError when s does not fit this run.
  void restore(const LoaderState& s);

  const TokenDataset& dataset() const { return dataset_; }
  const WindowSampler& sampler() const { return sampler_; }
  const LoaderOptions& options() const { return opts_; }
  int64_t local_len() const {
    return sp_local_length(opts_.seq_length, opts_.sp_layout, opts_.sp_size, opts_.sp_inner);
  }

 private:
  LoaderOptions opts_;
  TokenDataset dataset_;
  WindowSampler sampler_;
  int64_t vocab_limit_;
  int64_t next_step_ = 0, next_micro_ = 0;
};

}  // namespace easyctx::data
