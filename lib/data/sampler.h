// Deterministic sampling of training windows.
//
// Definition (docs/data.md, "Sampler"): let T be the dataset's token count and L the
// sequence length. The stream is cut into N = floor((T - 1) / L) windows; window j covers
// tokens [j*L, j*L + L + 1) (L inputs plus one more token for the last label; consecutive
// windows share one token). Sample i of the run belongs to epoch e = i / N and is window
// perm_e(i mod N), where perm_e is a pseudo-random permutation of [0, N) keyed by
// (seed, e): a Feistel network with cycle walking, so sample(i) is a pure O(1) function of
// (seed, i, T, L) with no state and no memory proportional to N.
//
// Batches: with B = batch_size, A = grad_accum, P = dp_size, the global batch of step s is
// the samples s*G + k, k in [0, G), G = B*A*P. Micro-batch m of data-parallel rank p holds
// k = (m*P + p)*B + b, b in [0, B). So (P=1, A=4) and (P=4, A=1) train on the same samples.
#pragma once
#include <cstdint>

namespace easyctx::data {

// SplitMix64 finaliser: the mixing function every seeded choice in this module uses.
uint64_t mix64(uint64_t x);

// A bijection of [0, n) keyed by `key`.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t x) const;  // x < n
  uint64_t size() const { return n_; }

 private:
  uint64_t feistel(uint64_t x) const;
  uint64_t n_, key_;
  int half_bits_;
  uint64_t half_mask_;
};

struct BatchShape {
  int64_t batch_size = 1;  // sequences per micro-batch per data-parallel rank
  int64_t grad_accum = 1;  // micro-batches per step
  int64_t dp_size = 1;     // data-parallel ranks
  int64_t global() const { return batch_size * grad_accum * dp_size; }
};

// Sample index of sequence b of micro-batch `micro` of data-parallel rank dp_rank at `step`.
uint64_t sample_index(const BatchShape& shape, int64_t step, int64_t micro, int64_t dp_rank, int64_t b);

class WindowSampler {
 public:
  // Throws InputError when the dataset has fewer than seq_length + 1 tokens.
  WindowSampler(uint64_t num_tokens, int64_t seq_length, uint64_t seed);
  uint64_t windows_per_epoch() const { return windows_; }
  int64_t seq_length() const { return seq_length_; }
  // Stream offset of the first of the seq_length + 1 tokens of sample i.
  uint64_t window_start(uint64_t sample) const;

 private:
  uint64_t windows_;
  int64_t seq_length_;
  uint64_t seed_;
};

}  // namespace easyctx::data
