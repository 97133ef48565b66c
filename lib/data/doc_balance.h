// Packed documents over a ring's ranks (data.document_mask with the zigzag or usp layout):
// the attention work each rank's queries do, and an order of a window's documents that evens
// it out. The zigzag split balances a causal square; documents change the work (a query sees
// only its own document's earlier keys), so the same split of a packed window can load one
// rank with long documents' tails and another with short documents. Under the document mask
// the order of a window's documents changes nothing the model computes (positions restart,
// attention stays inside each document), only which rank computes what.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace easyctx::data {

// Query-key pairs of causal attention inside documents of `lengths` tokens laid back to back
// from position 0, then one more document of padding up to Lp (as the loader builds a packed
// window), per ring rank: rank r's queries are chunks r and 2R - 1 - r of Lp / (2R) tokens.
// Lp must be a positive multiple of 2R and hold the documents.
std::vector<int64_t> ring_document_work(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks);

// The documents' order (a permutation of 0..n-1) with the lowest largest rank work a bounded
// local search finds, starting from the given order (kept when nothing beats it):
// deterministic from `seed`. Its cost is bounded: O(n + chunks) per candidate, a few million
// operations per window at most.
std::vector<std::size_t> balance_document_order(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks,
                                           uint64_t seed);

}  // namespace easyctx::data
