// Statistics of a token dataset that put a training loss in context.
#pragma once
#include <cstdint>

#include "data/dataset.h"

namespace easyctx::train {

struct UnigramStats {
  double entropy_nats = 0;  // -sum p log p over token frequencies: the loss of the best
                            // context-free predictor; a model must go well below it
  uint64_t tokens = 0;      // tokens counted
  int64_t distinct = 0;     // distinct ids seen
};

// Counts the first max_tokens tokens of the stream (all if fewer).
UnigramStats unigram_stats(const data::TokenDataset& ds, uint64_t max_tokens = 64ull << 20);

}  // namespace easyctx::train
