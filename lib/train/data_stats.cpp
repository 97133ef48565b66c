#include "train/data_stats.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

namespace easyctx::train {

UnigramStats unigram_stats(const data::TokenDataset& ds, uint64_t max_tokens) {
  UnigramStats s;
  s.tokens = std::min<uint64_t>(ds.num_tokens(), max_tokens);
  std::unordered_map<uint32_t, uint64_t> counts;
  std::vector<uint32_t> buf;
  const uint64_t chunk = 1 << 20;
  for (uint64_t off = 0; off < s.tokens; off += chunk) {
    const uint64_t n = std::min(chunk, s.tokens - off);
    buf.resize(n);
    ds.read(off, n, buf.data());
    for (uint32_t id : buf) ++counts[id];
  }
  // Sum in id order so the value is reproducible.
  std::vector<std::pair<uint32_t, uint64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  for (const auto& kv : sorted) {
    const double p = static_cast<double>(kv.second) / static_cast<double>(s.tokens);
    s.entropy_nats -= p * std::log(p);
  }
  s.distinct = static_cast<int64_t>(sorted.size());
  return s;
}

}  // namespace easyctx::train
