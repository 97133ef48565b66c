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

#include "core/config.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/sp_slice.h"

namespace easyctx::data {

struct LoaderOptions {
  std::string path;        // shard file, folder or glob (TokenDataset)
  int64_t seq_length = 0;  // L: inputs per sequence (a window has L + 1 tokens)
  uint64_t seed = 0;
  BatchShape shape;  // batch_size, grad_accum, dp_size
  int64_t dp_rank = 0;
  SpLayout sp_layout = SpLayout::None;
  int sp_size = 1;
  int sp_rank = 0;
  int sp_inner = 1;          // usp: the Ulysses degree (sp_rank = ring_rank * sp_inner + ulysses_rank)
  int32_t pad_id = 0;        // input id of padding positions (their labels are -1)
  bool check_tokens = true;  // check every window's ids < vocab when drawn (data.check_tokens)
  // Packing (docs/data.md, "Packing"): Window = the stream cut into windows (sampler.h);
  // BestFit / OnePerWindow = whole documents (or seq_length pieces of longer ones) per
  // sequence, padded with pad_id and label -1.
  DataPacking packing = DataPacking::Window;
  LongDocuments long_documents = LongDocuments::Split;
  // Positions restart at each document start; the label whose target starts a document is -1;
  // MicroBatch::doc_starts lists the starts (otherwise {0}: one document per sequence).
  bool document_mask = false;
  int64_t pack_pool = 4096;  // best_fit: documents per best-fit pool
};

struct MicroBatch {
  int64_t step = 0, micro = 0;
  int64_t batch = 0;      // B sequences
  int64_t local_len = 0;  // tokens per sequence on this SP rank (sp_local_length)
  // Row-major [batch, local_len]:
  std::vector<int32_t> tokens, labels, positions;
  int64_t real_labels = 0;           // labels != -1 in this rank's slice (loss denominator part)
  std::vector<uint64_t> sample_ids;  // [batch] global sample indices
  // [batch]: where each sequence's documents start, as offsets into the whole padded sequence
  // (sp_padded_length positions, not this rank's slice), first entry 0, increasing; the same
  // on every SP rank (see SpSlice::doc_starts). With document_mask false: {0} for every
  // sequence. With document_mask, padding at the end (packing's and the SP layout's) is more
  // documents, of at most kPaddingDocument tokens each (data/doc_balance.h). Attention may
  // restrict each query to keys of its own document.
  std::vector<std::vector<int64_t>> doc_starts;
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
  // The packing that fixes the sequences ("window", or e.g. "best_fit pool 4096 split"); a
  // cursor saved before packing existed reads as "window".
  std::string packing = "window";
  std::string to_json() const;
  static LoaderState from_json(const std::string& text);  // throws InputError on bad text
  bool operator==(const LoaderState& o) const;
};

// What the data gives the loss, counted when a loader opens (data.packing's units: pieces of
// documents for best_fit and one_per_window, windows of the stream for window). A unit with no
// labelled token (every target weighted 0, or a 1-token piece) trains nothing: the packed modes
// leave such pieces out (the prompt-only pieces `long_documents: split` cuts from a long
// prompt), the window mode keeps its windows, and a step made only of them is a step with no
// update (lib/train).
struct LabelCensus {
  uint64_t units = 0;                          // pieces (packed modes) or windows per epoch
  uint64_t unlabelled = 0;                     // of them without a labelled token (packed: left out)
  uint64_t unlabelled_docs = 0;                // packed: the documents those pieces come from
  std::string first;                           // the first such unit ("FILE document D piece P of N"), or ""
  std::vector<std::string> zero_weight_files;  // shards whose every loss weight is 0
  std::string describe() const;                // one line for the start-up log ("" when nothing is unlabelled)
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

  // The L + 1 tokens of global sample i (packing window only).
  std::vector<uint32_t> window(uint64_t sample) const;
  // Global sample i built in full (padded length, every SP rank's part; any packing).
  SpSequence sequence(uint64_t sample) const;
  // Packed modes: sequences per epoch and the documents (pieces) of each, as (stream start,
  // tokens) pairs, in the order the sequence lays them out. Window mode:
  // sampler().windows_per_epoch(), no pieces. With document_mask on the zigzag or usp layout
  // over 2 or more ring ranks, that order evens out the ranks' attention work
  // (data/doc_balance.h; docs/data.md): the same documents in every window, another order.
  uint64_t sequences_per_epoch() const;
  // Packed modes: tokens of the pieces packed (the dataset's, less the pieces left out).
  uint64_t packed_tokens() const;
  std::vector<std::pair<uint64_t, int64_t>> sequence_pieces(uint64_t index_in_epoch) const;
  std::string packing_name() const;
  const LabelCensus& label_census() const { return census_; }
  // Where global sample i comes from, for messages: "window of stream tokens [a, b): FILE
  // document D and the next K document(s), file tokens x..y" or its pieces ("FILE document D
  // piece P of N", ...).
  std::string describe_sample(uint64_t sample) const;

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
  // Packed modes: piece p is stream tokens [piece_start_[p], + piece_len_[p]); its last token's
  // label is the next stream token when piece_next_[p] (a split document goes on), else -1.
  // Sequence k holds pieces seq_pieces_[seq_begin_[k] .. seq_begin_[k+1]).
  std::vector<uint64_t> piece_start_;
  std::vector<int64_t> piece_len_;
  std::vector<uint8_t> piece_next_;
  std::vector<uint64_t> piece_doc_;  // the stream document each piece comes from
  std::vector<uint64_t> seq_pieces_, seq_begin_;
  LabelCensus census_;
  void make_pieces();
  void keep_labelled_pieces();  // census_; the pieces without a labelled token left out
  void count_unlabelled_windows();
  void build_packing();
  std::string describe_piece(uint64_t p) const;
  std::string describe_window(uint64_t start) const;
  uint64_t epoch_index(uint64_t sample) const;
  SpSequence window_sequence(uint64_t start) const;
  SpSequence packed_sequence(uint64_t k) const;
  std::vector<uint64_t> ordered_pieces(uint64_t k) const;  // sequence k's pieces in layout order
  int64_t next_step_ = 0, next_micro_ = 0;
};

}  // namespace easyctx::data
