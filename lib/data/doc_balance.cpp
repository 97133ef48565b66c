#include "data/doc_balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "data/sampler.h"

namespace easyctx::data {

namespace {

// Adds the pairs of the document [s, e) to the ranks owning the chunks it overlaps.
void add_document(int64_t s, int64_t e, int64_t c, int R, std::vector<int64_t>& work) {
  for (int64_t j = s / c; j * c < e; ++j) {
    const int64_t lo = std::max(s, j * c), hi = std::min(e, (j + 1) * c);
    const int64_t t0 = lo - s + 1, t1 = hi - s;  // query q sees q - s + 1 keys
    const int64_t owner = j < R ? j : 2 * int64_t(R) - 1 - j;
    work[static_cast<size_t>(owner)] += (t0 + t1) * (t1 - t0 + 1) / 2;
  }
}

// The ranks' work for the documents in `order` (then the padding documents to Lp) into `work`.
void rank_work(const std::vector<int64_t>& lengths, const std::vector<size_t>& order, int64_t Lp, int R,
               std::vector<int64_t>& work) {
  std::fill(work.begin(), work.end(), 0);
  const int64_t c = Lp / (2 * int64_t(R));
  int64_t at = 0;
  for (size_t i : order) {
    add_document(at, at + lengths[i], c, R, work);
    at += lengths[i];
  }
  for (; at < Lp; at += kPaddingDocument) add_document(at, std::min(Lp, at + kPaddingDocument), c, R, work);
}

// What the search lowers: the largest rank's work first, then the spread (the sum of squared
// shares of the mean), so that moves which even out the other ranks count too.
struct Score {
  int64_t largest = 0;
  double spread = 0;
  bool operator<(const Score& o) const { return largest != o.largest ? largest < o.largest : spread < o.spread; }
};
Score score(const std::vector<int64_t>& work, double mean) {
  Score s;
  for (int64_t w : work) {
    s.largest = std::max(s.largest, w);
    s.spread += (static_cast<double>(w) / mean) * (static_cast<double>(w) / mean);
  }
  return s;
}

}  // namespace

void append_padding_starts(std::vector<int64_t>& starts, int64_t at, int64_t Lp) {
  for (; at < Lp; at += kPaddingDocument) starts.push_back(at);
}

std::vector<int64_t> ring_document_work(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks) {
  EASYCTX_CHECK(ring_ranks > 0 && Lp > 0 && Lp % (2 * int64_t(ring_ranks)) == 0, "ring_document_work: length ", Lp,
                " is not a positive multiple of 2 x ", ring_ranks, " ranks");
  int64_t total = 0;
  for (int64_t n : lengths) {
    EASYCTX_CHECK(n > 0, "ring_document_work: a document of ", n, " tokens");
    total += n;
  }
  EASYCTX_CHECK(total <= Lp, "ring_document_work: ", total, " tokens of documents in a window of ", Lp);
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::vector<int64_t> work(static_cast<size_t>(ring_ranks));
  rank_work(lengths, order, Lp, ring_ranks, work);
  return work;
}

std::vector<size_t> balance_document_order(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks,
                                           uint64_t seed) {
  const std::vector<int64_t> start = ring_document_work(lengths, Lp, ring_ranks);  // (checks the arguments)
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const size_t n = lengths.size();
  if (n < 2 || ring_ranks < 2) return order;
  const int64_t total = std::accumulate(start.begin(), start.end(), int64_t{0});
  const double mean = static_cast<double>(total) / ring_ranks;
  const int64_t floor = (total + ring_ranks - 1) / ring_ranks;  // no order does better than the mean
  std::vector<int64_t> work(static_cast<size_t>(ring_ranks));
  Score best = score(start, mean);
  // Random swaps and moves of one document, kept when the score drops.
  const int64_t cost = 2 * static_cast<int64_t>(n) + 2 * int64_t(ring_ranks);
  const int64_t tries = std::clamp<int64_t>(8'000'000 / cost, 64, 20000);
  uint64_t state = mix64(seed ^ 0xba1a9ceull);
  auto next = [&](uint64_t m) {
    state = mix64(state + 0x9e3779b97f4a7c15ull);
    return static_cast<size_t>(state % m);
  };
  // Annealed on the spread (a worse candidate is taken with probability exp(-rise / T), T
  // falling geometrically), the best order seen kept.
  std::vector<size_t> trial, current = order;
  double now = best.spread;
  const double t0 = 0.02, t1 = 1e-5;
  for (int64_t t = 0; t < tries && best.largest > floor; ++t) {
    const size_t i = next(n), j = next(n);
    if (i == j) continue;
    trial = current;
    if (t % 2 == 0) {
      std::swap(trial[i], trial[j]);
    } else {  // move document i to position j
      const size_t d = trial[i];
      trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(i));
      trial.insert(trial.begin() + static_cast<std::ptrdiff_t>(j), d);
    }
    rank_work(lengths, trial, Lp, ring_ranks, work);
    const Score s = score(work, mean);
    const double temp = t0 * std::pow(t1 / t0, static_cast<double>(t) / static_cast<double>(tries));
    const double u = static_cast<double>(next(1u << 30)) / static_cast<double>(1u << 30);
    if (s.spread <= now || u < std::exp((now - s.spread) / temp)) {
      now = s.spread;
      current.swap(trial);
      if (s < best) {
        best = s;
        order = current;
      }
    }
  }
  return order;
}

}  // namespace easyctx::data
