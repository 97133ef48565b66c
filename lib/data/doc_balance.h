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

// Under the document mask the padding at a sequence's end (packing's and the SP layout's) is
// cut into documents of at most this many tokens, positions restarting in each. Nothing real
// attends to padding and padding carries no label, so this changes no loss or gradient; it
// bounds what the padding costs: about pad x 512 query-key pairs instead of pad^2 / 2. (Measured
// before, llama2-7b at 128K on 2K-16K documents: an epoch's last best-fit window, 87% padding,
// computed 0.76 of a causal square's pairs, a full window 0.12.)
inline constexpr int64_t kPaddingDocument = 1024;

// Appends to `starts` the starts of the padding documents that cover [at, Lp): at, at + 1024,
// ... (nothing when at >= Lp).
void append_padding_starts(std::vector<int64_t>& starts, int64_t at, int64_t Lp);

// Query-key pairs of causal attention inside documents of `lengths` tokens laid back to back
// from position 0, then the padding up to Lp in documents of kPaddingDocument tokens (as the
// loader builds a packed window), per ring rank: rank r's queries are chunks r and 2R - 1 - r of Lp / (2R) tokens.
// Lp must be a positive multiple of 2R and hold the documents.
std::vector<int64_t> ring_document_work(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks);

// The documents' order (a permutation of 0..n-1) with the lowest largest rank work a bounded
// local search finds, starting from the given order (kept when nothing beats it):
// deterministic from `seed`. Its cost is bounded: O(n + chunks) per candidate, a few million
// operations per window at most.
std::vector<std::size_t> balance_document_order(const std::vector<int64_t>& lengths, int64_t Lp, int ring_ranks,
                                                uint64_t seed);

}  // namespace easyctx::data
