// Document masking for every strategy (data.document_mask): a block of attention over a
// packed sequence, run as the parts of it where queries and keys share a document; and the
// sliding window's block skipping (a block whose keys all lie a window or more before its
// queries is not run).
//
// Documents are contiguous runs of positions, so the visible part of a block (queries
// [q_offset, q_offset + Sq) against keys [k_offset, k_offset + Sk)) is, per document that
// both ranges touch, one rectangle (keys before the queries) or one causal square (the
// block's diagonal); different documents' parts share no query row and no key row. Each
// part is an ordinary unmasked block of the backend's attention (the CPU reference, or the
// CUDA routes: cuDNN and the Hopper kernels at full speed), so no kernel needs a mask, and
// blocks where no query and key share a document cost nothing. A block inside one document
// runs as it always did.
//
// Queries of the block whose document has no key in it get o = 0 and lse = -inf (their
// part of a ring merge is empty); their gradients get nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "attention/attention.h"
#include "ops/ops.h"

namespace easyctx::attention {

// Rows [q_row, q_row + q_len) of a block's queries against rows [k_row, k_row + k_len) of
// its keys (relative to the block), causal when on the block's diagonal.
struct DocumentPart {
  int64_t q_row = 0, q_len = 0, k_row = 0, k_len = 0;
  bool causal = false;
  bool operator==(const DocumentPart& o) const {
    return q_row == o.q_row && q_len == o.q_len && k_row == o.k_row && k_len == o.k_len && causal == o.causal;
  }
};

// The parts of block `blk` (sq queries, sk keys) that the documents leave visible, in
// document order. Throws Error when `starts` is not increasing from 0. Pure (the plan and
// the tests call it).
std::vector<DocumentPart> document_parts(const DocumentStarts& starts, const ops::AttentionBlock& blk, int64_t sq,
                                         int64_t sk);

// True when `starts` divides the sequence at all (more than one document).
inline bool has_documents(const DocumentStarts* starts) { return starts != nullptr && starts->size() > 1; }

// The parts of the block that the documents (`starts`: one per shared document; nullptr or one
// document: the whole block) and blk.window (a part whose last key is a window or more
// before its first query is dropped) leave visible. Each part runs with the block's window.
std::vector<DocumentPart> visible_parts(const DocumentStarts* starts, const ops::AttentionBlock& blk, int64_t sq,
                                        int64_t sk);

// The attention work of the queries at positions [q_begin, q_end) of a packed sequence: the
// number of (query, key) pairs they compute, causal, inside their documents (`starts`, empty
// or {0}: one), inside the window (0: none). Closed form per document, O(documents).
int64_t visible_pairs(const DocumentStarts& starts, int64_t q_begin, int64_t q_end, int64_t window);

// Backend::attention_fwd of one sequence's block (q [1, Sq, Hq, hd], ...) under the
// document mask `starts` and the block's sliding window (neither: the plain call). Writes
// o and lse for every query row; returns false when no query of the block sees a key (o = 0,
// lse = -inf: a ring may skip its merge, a block wholly outside the window costs nothing).
bool masked_attention_fwd(ops::Backend& be, const DocumentStarts* starts, const ops::Tensor& q, const ops::Tensor& k,
                          const ops::Tensor& v, const ops::AttentionBlock& blk, const ops::Tensor& o,
                          const ops::Tensor& lse);
// Backend::attention_bwd likewise (blk.accumulate as there: false overwrites every row of
// dq/dk/dv, rows outside every part with zeros).
void masked_attention_bwd(ops::Backend& be, const DocumentStarts* starts, const ops::Tensor& q, const ops::Tensor& k,
                          const ops::Tensor& v, const ops::Tensor& o, const ops::Tensor& lse, const ops::Tensor& dout,
                          const ops::AttentionBlock& blk, const ops::Tensor& dq, const ops::Tensor& dk,
                          const ops::Tensor& dv);

}  // namespace easyctx::attention
