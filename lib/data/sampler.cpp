#include "data/sampler.h"

#include "core/checked.h"
#include "core/error.h"

namespace easyctx::data {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  EASYCTX_CHECK(n > 0, "Permutation of an empty range");
  // Smallest even bit width 2h with 2^(2h) >= n: the walk leaves [0, n) with probability
  // < 3/4 per step, so the expected number of Feistel evaluations is below 4.
  int bits = 0;
  while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
  if (half_bits_ == 0) half_bits_ = 1;
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

uint64_t Permutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t round = 0; round < 6; ++round) {
    uint64_t f = mix64(right ^ mix64(key_ + round)) & half_mask_;
    uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t x) const {
  EASYCTX_CHECK(x < n_, "Permutation: ", x, " outside [0, ", n_, ")");
  // Cycle walking: a permutation of the power-of-4 domain restricted to [0, n) stays a
  // bijection when we re-apply it until the value lands inside.
  do { x = feistel(x); } while (x >= n_);
  return x;
}

uint64_t sample_index(const BatchShape& s, int64_t step, int64_t micro, int64_t dp_rank, int64_t b) {
  EASYCTX_CHECK(s.batch_size > 0 && s.grad_accum > 0 && s.dp_size > 0, "BatchShape must be positive");
  EASYCTX_CHECK(step >= 0 && micro >= 0 && micro < s.grad_accum && dp_rank >= 0 && dp_rank < s.dp_size && b >= 0 &&
                    b < s.batch_size,
                "sample_index: (step ", step, ", micro ", micro, ", dp_rank ", dp_rank, ", b ", b,
                ") outside the batch shape");
  const uint64_t global = static_cast<uint64_t>(
      checked_product({s.batch_size, s.grad_accum, s.dp_size}, "global batch, batch_size x grad_accum x dp_size"));
  const uint64_t k = static_cast<uint64_t>((micro * s.dp_size + dp_rank) * s.batch_size + b);  // < global
  return checked_add(checked_mul(static_cast<uint64_t>(step), global, "sample index, step x global batch"), k,
                     "sample index");
}

WindowSampler::WindowSampler(uint64_t num_tokens, int64_t seq_length, uint64_t seed)
    : seq_length_(seq_length), seed_(seed) {
  EASYCTX_CHECK_INPUT(seq_length > 0, "seq_length must be > 0, got ", seq_length);
  const uint64_t L = static_cast<uint64_t>(seq_length);
  EASYCTX_CHECK_INPUT(num_tokens >= L + 1, "the dataset has ", num_tokens,
                      " tokens, fewer than seq_length + 1 = ", L + 1,
                      "; tokenize more text or lower the sequence length");
  windows_ = (num_tokens - 1) / L;
}

uint64_t WindowSampler::window_start(uint64_t sample) const {
  uint64_t epoch = sample / windows_;
  Permutation perm(windows_, mix64(seed_ ^ mix64(epoch + 0x5eed)));
  return perm(sample % windows_) * static_cast<uint64_t>(seq_length_);
}

}  // namespace easyctx::data
