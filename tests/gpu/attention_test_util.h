// Helpers for the attention tests of the CUDA backend against the CPU reference that run every
// case in several backend modes (test_cuda_documents, test_cuda_windows): document starts
// from lengths, a mode's backend (Hopper modes skipped off sm_90), the routes the router picks,
// and the two checks: LocalAttention over whole sequences, masked_attention_fwd/bwd on one
// block of one sequence. Inputs are random and bf16-rounded (the reference sees exactly the
// GPU's), outputs NaN-poisoned first.
#pragma once
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/documents.h"
#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"
#include "ops/attention_route.h"

namespace easyctx::test {

using attention::DocumentStarts;

inline DocumentStarts starts_of(const std::vector<int64_t>& lengths) {
  DocumentStarts s;
  int64_t at = 0;
  for (int64_t n : lengths) {
    s.push_back(at);
    at += n;
  }
  return s;
}

// LocalAttention over B sequences of S tokens: the shape, window (0: none) and documents (one
// DocumentStarts a sequence), the inputs, then the CPU reference's outputs.
struct LocalData {
  int64_t B = 0, S = 0, hq = 0, hkv = 0, hd = 0, window = 0;
  std::vector<DocumentStarts> docs;
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
};

// One block's shape: sq queries, sk keys of one sequence.
struct BlockShape {
  int64_t sq, sk, hq, hkv, hd;
};

class CudaAttentionTest : public CudaOpsTest {
 protected:
  // Makes `gpu` the backend of options o; false (with a line saying why) for a Hopper mode on a
  // device that is not sm_90.
  bool use_backend(const ops::CudaBackendOptions& o, const char* what) {
    if (o.sm90_attention && !kernels::sm90_device_available()) {
      std::printf("[path] %s: not an sm_90 device, the mode runs no Hopper kernel; skipped\n", what);
      return false;
    }
    gpu = ops::make_cuda_backend(o);
    return true;
  }

  // Draws d's inputs (its shape, window and documents set) and runs the CPU reference: forward
  // o and lse, o rounded to bf16 (what the GPU holds), backward dq/dk/dv from a random dout.
  void local_reference(LocalData& d) {
    const DType t = DType::BF16;
    const int64_t nq = d.B * d.S * d.hq * d.hd, nk = d.B * d.S * d.hkv * d.hd;
    d.q = rand(nq, t, -2, 2);
    d.k = rand(nk, t, -2, 2);
    d.v = rand(nk, t);
    d.dout = rand(nq, t);
    d.o.assign(static_cast<size_t>(nq), 0);
    d.lse.assign(static_cast<size_t>(d.B * d.hq * d.S), 0);
    d.dq.assign(static_cast<size_t>(nq), -3);
    d.dk.assign(static_cast<size_t>(nk), -3);
    d.dv.assign(static_cast<size_t>(nk), -3);
    attention::LocalAttention a(*cpu);
    auto hq = [&](std::vector<float>& x) { return host(x, {d.B, d.S, d.hq, d.hd}); };
    auto hk = [&](std::vector<float>& x) { return host(x, {d.B, d.S, d.hkv, d.hd}); };
    const double scale = 1 / std::sqrt(static_cast<double>(d.hd));
    const attention::AttentionTensors ht{hq(d.q), hk(d.k),       hk(d.v), hq(d.o), host(d.lse, {d.B, d.hq, d.S}),
                                         scale,   d.docs.data(), d.window};
    a.forward(ht);
    d.o = rounded(d.o, t);  // the backward's o: what the GPU holds
    a.backward(ht, {hq(d.dout), hq(d.dq), hk(d.dk), hk(d.dv)});
  }

  // LocalAttention on the GPU against the reference in d: forward o/lse, then the backward from
  // the reference's o and lse into poisoned gradients; with `rerun` (a deterministic mode), a
  // second backward that must be bit-identical.
  void check_local(const LocalData& d, bool rerun) {
    const DType t = DType::BF16;
    Buffer bq = upload(d.q, t), bk = upload(d.k, t), bv = upload(d.v, t),
           bo = gpu->alloc(t, static_cast<int64_t>(d.o.size())),
           bl = gpu->alloc(DType::F32, static_cast<int64_t>(d.lse.size()));
    poison(bo);
    poison(bl);
    auto qv = [&](const Buffer& x) { return x.view({d.B, d.S, d.hq, d.hd}); };
    auto kv = [&](const Buffer& x) { return x.view({d.B, d.S, d.hkv, d.hd}); };
    attention::LocalAttention a(*gpu);
    const double scale = 1 / std::sqrt(static_cast<double>(d.hd));
    a.forward({qv(bq), kv(bk), kv(bv), qv(bo), bl.view({d.B, d.hq, d.S}), scale, d.docs.data(), d.window});
    EXPECT_REL(download(bo), d.o, 1e-2);
    expect_lse_close(download(bl), d.lse, tag);
    Buffer bo2 = upload(d.o, t), bl2 = upload(d.lse, DType::F32), bdo = upload(d.dout, t);
    const attention::AttentionTensors gt{qv(bq), kv(bk),        kv(bv),  qv(bo2), bl2.view({d.B, d.hq, d.S}),
                                         scale,  d.docs.data(), d.window};
    auto backward = [&](Buffer& dq, Buffer& dk, Buffer& dv) {
      dq = gpu->alloc(t, static_cast<int64_t>(d.dq.size()));
      dk = gpu->alloc(t, static_cast<int64_t>(d.dk.size()));
      dv = gpu->alloc(t, static_cast<int64_t>(d.dv.size()));
      poison(dq);
      poison(dk);
      poison(dv);
      a.backward(gt, {qv(bdo), qv(dq), kv(dk), kv(dv)});
    };
    Buffer dq, dk, dv;
    backward(dq, dk, dv);
    EXPECT_REL(download(dq), d.dq, 3e-2);
    EXPECT_REL(download(dk), d.dk, 3e-2);
    EXPECT_REL(download(dv), d.dv, 3e-2);
    if (rerun) {
      Buffer dq2, dk2, dv2;
      backward(dq2, dk2, dv2);
      EXPECT_EQ(download_bits(dq2), download_bits(dq));
      EXPECT_EQ(download_bits(dk2), download_bits(dk));
      EXPECT_EQ(download_bits(dv2), download_bits(dv));
    }
  }

  // masked_attention_fwd/bwd of blk under `docs` over random q/k/v of shape s, the GPU against
  // the CPU reference: the forward (the same answer to "does any row see a key", o, lse), then
  // the backward onto random starting gradients of bf16 and of f32 (a ring's accumulators).
  void check_block(const BlockShape& s, const DocumentStarts& docs, const ops::AttentionBlock& blk) {
    const DType t = DType::BF16;
    const int64_t nq = s.sq * s.hq * s.hd, nk = s.sk * s.hkv * s.hd;
    BlockData b;
    b.q = rand(nq, t, -2, 2);
    b.k = rand(nk, t, -2, 2);
    b.v = rand(nk, t);
    b.o.assign(static_cast<size_t>(nq), 0);
    b.lse.assign(static_cast<size_t>(s.hq * s.sq), 0);
    const bool seen = attention::masked_attention_fwd(
        *cpu, &docs, host(b.q, {1, s.sq, s.hq, s.hd}), host(b.k, {1, s.sk, s.hkv, s.hd}),
        host(b.v, {1, s.sk, s.hkv, s.hd}), blk, host(b.o, {1, s.sq, s.hq, s.hd}), host(b.lse, {1, s.hq, s.sq}));
    b.bq = upload(b.q, t);
    b.bk = upload(b.k, t);
    b.bv = upload(b.v, t);
    Buffer bo = gpu->alloc(t, nq), bl = gpu->alloc(DType::F32, s.hq * s.sq);
    poison(bo);
    poison(bl);
    const bool gseen = attention::masked_attention_fwd(
        *gpu, &docs, b.bq.view({1, s.sq, s.hq, s.hd}), b.bk.view({1, s.sk, s.hkv, s.hd}),
        b.bv.view({1, s.sk, s.hkv, s.hd}), blk, bo.view({1, s.sq, s.hq, s.hd}), bl.view({1, s.hq, s.sq}));
    EXPECT_EQ(gseen, seen);
    EXPECT_REL(download(bo), b.o, 1e-2);
    expect_lse_close(download(bl), b.lse, tag);
    b.o = rounded(b.o, t);
    for (DType gt : {DType::BF16, DType::F32}) block_backward(s, docs, blk, b, gt);
  }

  // The router's forward and backward routes for c, kept until routes().
  void note_route(const ops::AttentionCall& c) {
    fwd_routes_.insert(gpu->attention_route(c, false));
    bwd_routes_.insert(gpu->attention_route(c, true));
  }
  // "forward {...}; backward {...}": the routes noted since the last call (then forgotten).
  std::string routes() {
    auto join = [](const std::set<std::string>& s) {
      std::string r;
      for (const auto& x : s) r += (r.empty() ? "" : ", ") + x;
      return r;
    };
    const std::string r = "forward {" + join(fwd_routes_) + "}; backward {" + join(bwd_routes_) + "}";
    fwd_routes_.clear();
    bwd_routes_.clear();
    return r;
  }

 private:
  // check_block's inputs and reference outputs (host) and inputs on the GPU.
  struct BlockData {
    std::vector<float> q, k, v, o, lse;
    Buffer bq, bk, bv;
  };
  // Accumulates onto random starting gradients of type gt.
  void block_backward(const BlockShape& s, const DocumentStarts& docs, const ops::AttentionBlock& blk, BlockData& b,
                      DType gt) {
    const DType t = DType::BF16;
    const int64_t nq = s.sq * s.hq * s.hd, nk = s.sk * s.hkv * s.hd;
    auto dout = rand(nq, t), dq0 = rand(nq, gt, -0.05, 0.05), dk0 = rand(nk, gt, -0.05, 0.05),
         dv0 = rand(nk, gt, -0.05, 0.05);
    auto dq = dq0, dk = dk0, dv = dv0;
    attention::masked_attention_bwd(*cpu, &docs, host(b.q, {1, s.sq, s.hq, s.hd}), host(b.k, {1, s.sk, s.hkv, s.hd}),
                                    host(b.v, {1, s.sk, s.hkv, s.hd}), host(b.o, {1, s.sq, s.hq, s.hd}),
                                    host(b.lse, {1, s.hq, s.sq}), host(dout, {1, s.sq, s.hq, s.hd}), blk,
                                    host(dq, {1, s.sq, s.hq, s.hd}), host(dk, {1, s.sk, s.hkv, s.hd}),
                                    host(dv, {1, s.sk, s.hkv, s.hd}));
    Buffer bo = upload(b.o, t), bl = upload(b.lse, DType::F32), bdo = upload(dout, t), bdq = upload(dq0, gt),
           bdk = upload(dk0, gt), bdv = upload(dv0, gt);
    auto qv = [&](const Buffer& x) { return x.view({1, s.sq, s.hq, s.hd}); };
    auto kv = [&](const Buffer& x) { return x.view({1, s.sk, s.hkv, s.hd}); };
    attention::masked_attention_bwd(*gpu, &docs, qv(b.bq), kv(b.bk), kv(b.bv), qv(bo), bl.view({1, s.hq, s.sq}),
                                    qv(bdo), blk, qv(bdq), kv(bdk), kv(bdv));
    const std::string base = tag;
    tag = base + (gt == DType::F32 ? " f32 grads" : " bf16 grads");
    const auto gdq = download(bdq), gdk = download(bdk), gdv = download(bdv);
    EXPECT_ACCUMULATED(gdq, dq, dq0);
    EXPECT_ACCUMULATED(gdk, dk, dk0);
    EXPECT_ACCUMULATED(gdv, dv, dv0);
    tag = base;
  }

  std::set<std::string> fwd_routes_, bwd_routes_;
};

}  // namespace easyctx::test
