// The CUDA backend's attention router (ops/attention_route.h) and the scratch specs
// (ops/scratch.h), on the CPU: the routes chosen for representative calls (causal squares
// short and long, batch > 1, a ring's off-diagonal and partial blocks, f32 gradients,
// deterministic and atomic, tile sizes), the bytes each route allocates, and the route in
// the per-op profile's keys of a backend that reports one; which Hopper kernel variant a call
// takes (kernels/attention_sm90_variants.h).
#include <map>
#include <random>

#include "kernels/attention_sm90_variants.h"
#include "ops/attention_route.h"
#include "ops/profile.h"
#include "ops/scratch.h"
#include "ops_test_util.h"

namespace easyctx::test {
namespace {

using ops::AttentionBwdRoute;
using ops::AttentionCall;
using ops::AttentionFwdRoute;
using ops::AttentionRouteOptions;
using Fwd = std::vector<AttentionFwdRoute>;
using Bwd = std::vector<AttentionBwdRoute>;
constexpr AttentionFwdRoute kGraph = AttentionFwdRoute::CudnnCausalGraph;
constexpr AttentionFwdRoute kChunks = AttentionFwdRoute::CudnnCausalChunks;
constexpr AttentionFwdRoute kUnmasked = AttentionFwdRoute::CudnnUnmasked;
constexpr AttentionFwdRoute kFwdKernel = AttentionFwdRoute::Kernel;

AttentionCall call(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t hd, bool causal = true,
                   int64_t diag = 0) {
  return AttentionCall{b, sq, sk, hq, hkv, hd, causal, diag};
}
AttentionCall overwriting(AttentionCall c) {
  c.accumulate = false;
  return c;
}
AttentionCall f32(AttentionCall c) {
  c.f32_grads = true;
  return c;
}
AttentionRouteOptions opts(bool det = true, int64_t tile = 0, bool cudnn = true, bool graph = true) {
  AttentionRouteOptions o;
  o.cudnn = cudnn;
  o.causal_graph = graph;
  o.deterministic = det;
  o.bwd_tile = tile;
  return o;
}

TEST(AttentionRoute, CausalSquares) {
  const AttentionRouteOptions det = opts(true), atomic = opts(false);
  EXPECT_EQ(det.tile(), 4096);
  EXPECT_EQ(atomic.tile(), 8192);
  // Short (one GPU's 2K sequence): the causal graph, else query chunks (S >= 2 x 1024), else the kernel.
  const AttentionCall s2k = call(1, 2048, 2048, 32, 4, 64);
  EXPECT_EQ(ops::attention_fwd_routes(s2k, det), (Fwd{kGraph, kChunks, kFwdKernel}));
  EXPECT_EQ(ops::attention_bwd_routes(s2k, det), (Bwd{AttentionBwdRoute::CudnnOneCall, AttentionBwdRoute::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(s2k), det),
            (Bwd{AttentionBwdRoute::CudnnInPlace, AttentionBwdRoute::CudnnOneCall, AttentionBwdRoute::Kernel}));
  // Too short for chunks: the graph or the kernel.
  const AttentionCall s2000 = call(1, 2000, 2000, 32, 32, 128);
  EXPECT_EQ(ops::attention_fwd_routes(s2000, det), (Fwd{kGraph, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(s2000, opts(true, 0, true, false)), (Fwd{kFwdKernel}));
  // Long (64K): tiles deterministic, in place only with atomic dQ.
  const AttentionCall s64k = call(1, 65536, 65536, 32, 4, 64);
  EXPECT_EQ(ops::attention_fwd_route(s64k, det), AttentionFwdRoute::CudnnCausalGraph);
  EXPECT_EQ(ops::attention_fwd_route(s64k, opts(true, 0, true, false)), AttentionFwdRoute::CudnnCausalChunks);
  EXPECT_EQ(ops::attention_bwd_routes(s64k, det), (Bwd{AttentionBwdRoute::CudnnTiles, AttentionBwdRoute::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(s64k), det),
            (Bwd{AttentionBwdRoute::CudnnTiles, AttentionBwdRoute::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(s64k), atomic),
            (Bwd{AttentionBwdRoute::CudnnInPlace, AttentionBwdRoute::CudnnTiles, AttentionBwdRoute::Kernel}));
  // Deterministic in place up to T x T exactly.
  EXPECT_EQ(ops::attention_bwd_route(overwriting(call(1, 4096, 4096, 32, 4, 64)), det),
            AttentionBwdRoute::CudnnInPlace);
  EXPECT_EQ(ops::attention_bwd_route(overwriting(call(1, 4097, 4097, 32, 4, 64)), det), AttentionBwdRoute::CudnnTiles);
  // Batch > 1: no query chunks (batch 1 only); the rest as for one sequence.
  const AttentionCall b2 = call(2, 8192, 8192, 8, 2, 128);
  EXPECT_EQ(ops::attention_fwd_routes(b2, det), (Fwd{kGraph, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(b2, opts(true, 0, true, false)), (Fwd{kFwdKernel}));
  EXPECT_EQ(ops::attention_bwd_route(b2, det), AttentionBwdRoute::CudnnTiles);
  EXPECT_EQ(ops::attention_bwd_route(b2, atomic), AttentionBwdRoute::CudnnOneCall);
  // A 1 x 1 square is also a block without a mask: its fallback before the kernel.
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 1, 1, 4, 4, 64), det), (Fwd{kGraph, kUnmasked, kFwdKernel}));
}

// An sm_90 device (AttentionRouteOptions::sm90): the Hopper kernel before cuDNN where it
// measured faster (head dim 64; head dim 128 with a mask), else after cuDNN's routes, before
// the FA2 kernel.
TEST(AttentionRoute, HopperForward) {
  AttentionRouteOptions h = opts(false);
  h.sm90 = true;
  const AttentionFwdRoute kSm90 = AttentionFwdRoute::Sm90Kernel;
  // Head dim 128: causal squares and partial masks first; unmasked blocks after cuDNN SDPA.
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 32768, 32768, 32, 32, 128), h),
            (Fwd{kSm90, kGraph, kChunks, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 200, 300, 4, 4, 128, true, 0), h), (Fwd{kSm90, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 4096, 4096, 32, 8, 128, true, 4096), h),
            (Fwd{kUnmasked, kSm90, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 77, 190, 8, 4, 128, false, 0), h), (Fwd{kUnmasked, kSm90, kFwdKernel}));
  // Head dim 64: first for every visibility.
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 32768, 32768, 32, 4, 64), h), (Fwd{kSm90, kGraph, kChunks, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 200, 300, 4, 4, 64, true, 0), h), (Fwd{kSm90, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 77, 190, 8, 4, 64, false, 0), h), (Fwd{kSm90, kUnmasked, kFwdKernel}));
  // Another head dim (the kernel declines it at run time): after cuDNN.
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 4096, 4096, 8, 8, 96), h), (Fwd{kGraph, kChunks, kSm90, kFwdKernel}));
  EXPECT_TRUE(ops::sm90_before_cudnn(call(1, 1, 1, 1, 1, 64, false, 0)));
  EXPECT_FALSE(ops::sm90_before_cudnn(call(1, 8, 8, 1, 1, 128, false, 0)));
  // Without cuDNN: the Hopper kernel, then the FA2 kernel; no keys stays no keys.
  AttentionRouteOptions hn = opts(false, 0, false);
  hn.sm90 = true;
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 1024, 1024, 8, 8, 128, false, 0), hn), (Fwd{kSm90, kFwdKernel}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 16, 0, 8, 8, 128), h), (Fwd{AttentionFwdRoute::NoKeys}));
  EXPECT_STREQ(ops::route_name(kSm90), "sm90 kernel");
}

// The Hopper kernels a call takes: forward by head dim (wide at 64, persistent at 128; no
// other head dim), backward by the backend's mode; Auto resolves to the same.
TEST(AttentionRoute, HopperVariants) {
  using kernels::Sm90BwdVariant;
  using kernels::Sm90FwdVariant;
  EXPECT_EQ(kernels::sm90_fwd_variant_for(64), Sm90FwdVariant::Wide);
  EXPECT_EQ(kernels::sm90_fwd_variant_for(128), Sm90FwdVariant::Persistent);
  EXPECT_EQ(kernels::sm90_fwd_resolve(Sm90FwdVariant::Auto, 64), Sm90FwdVariant::Wide);
  EXPECT_EQ(kernels::sm90_fwd_resolve(Sm90FwdVariant::Auto, 128), Sm90FwdVariant::Persistent);
  EXPECT_EQ(kernels::sm90_fwd_resolve(Sm90FwdVariant::Wide, 128), Sm90FwdVariant::Wide);
  EXPECT_TRUE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Wide, 64));
  EXPECT_FALSE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Wide, 128));
  EXPECT_TRUE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Persistent, 128));
  EXPECT_FALSE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Persistent, 64));
  EXPECT_TRUE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Auto, 64));
  EXPECT_FALSE(kernels::sm90_fwd_variant_supported(Sm90FwdVariant::Auto, 96));
  EXPECT_EQ(kernels::sm90_fwd_variants(),
            (std::vector<Sm90FwdVariant>{Sm90FwdVariant::Persistent, Sm90FwdVariant::Wide}));
  EXPECT_STREQ(kernels::sm90_fwd_variant_name(Sm90FwdVariant::Persistent), "persistent");
  EXPECT_STREQ(kernels::sm90_fwd_variant_name(Sm90FwdVariant::Wide), "wide");
  EXPECT_STREQ(kernels::sm90_fwd_variant_name(Sm90FwdVariant::Auto), "auto");

  EXPECT_EQ(kernels::sm90_bwd_variant_for(true), Sm90BwdVariant::DeterministicSplit);
  EXPECT_EQ(kernels::sm90_bwd_variant_for(false), Sm90BwdVariant::AtomicSplit);
  EXPECT_TRUE(kernels::sm90_bwd_variant_deterministic(Sm90BwdVariant::DeterministicSplit));
  EXPECT_FALSE(kernels::sm90_bwd_variant_deterministic(Sm90BwdVariant::AtomicSplit));
  EXPECT_TRUE(kernels::sm90_bwd_variant_supported(Sm90BwdVariant::AtomicSplit, 64));
  EXPECT_TRUE(kernels::sm90_bwd_variant_supported(Sm90BwdVariant::DeterministicSplit, 128));
  EXPECT_FALSE(kernels::sm90_bwd_variant_supported(Sm90BwdVariant::DeterministicSplit, 96));
  EXPECT_STREQ(kernels::sm90_bwd_variant_name(Sm90BwdVariant::AtomicSplit), "atomic-split");
  EXPECT_STREQ(kernels::sm90_bwd_variant_name(Sm90BwdVariant::DeterministicSplit), "deterministic-split");
}

// The Hopper backward: first in the deterministic mode at head dim 128 and (unmasked, or 16K
// rows and more) 64 (faster than cuDNN's deterministic graph in the same process), for every
// visibility, overwriting or not, bf16 or f32 gradients; elsewhere after cuDNN's routes, in
// place of the FA2 kernel's first turn.
TEST(AttentionRoute, HopperBackward) {
  using B = AttentionBwdRoute;
  AttentionRouteOptions det = opts(true), atomic = opts(false), bare = opts(true, 0, false);
  det.sm90 = atomic.sm90 = bare.sm90 = true;
  const AttentionCall s32k = call(1, 32768, 32768, 32, 32, 128), s1k = call(1, 1024, 1024, 32, 32, 128);
  EXPECT_EQ(ops::attention_bwd_routes(s32k, det), (Bwd{B::Sm90Kernel, B::CudnnTiles, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(s1k), det), (Bwd{B::Sm90Kernel, B::CudnnOneCall, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(f32(call(1, 4096, 4096, 32, 4, 128, true, 4096)), det),
            (Bwd{B::Sm90Kernel, B::CudnnOneCall, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(call(2, 150, 130, 8, 2, 128, true, 64), det), (Bwd{B::Sm90Kernel, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 77, 190, 8, 4, 128, false, 0), bare), (Bwd{B::Sm90Kernel, B::Kernel}));
  EXPECT_TRUE(ops::sm90_bwd_before_cudnn(s32k, det));
  // Head dim 64 deterministic: first for blocks without a mask (a ring's off-diagonal steps).
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 4096, 4096, 32, 4, 64, false, 0), det),
            (Bwd{B::Sm90Kernel, B::CudnnOneCall, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(f32(call(1, 4096, 4096, 32, 4, 64, true, 4096)), det),
            (Bwd{B::Sm90Kernel, B::CudnnOneCall, B::Kernel}));
  // Head dim 64 deterministic with a mask: first from 16K query rows on (a causal square of one
  // GPU, a ring's diagonal chunk), cuDNN first below; every atomic call: cuDNN first (in place
  // where it can).
  EXPECT_TRUE(ops::sm90_bwd_before_cudnn(call(1, 32768, 32768, 32, 4, 64), det));
  EXPECT_TRUE(ops::sm90_bwd_before_cudnn(call(1, 16384, 16384, 32, 4, 64), det));
  EXPECT_FALSE(ops::sm90_bwd_before_cudnn(call(1, 16383, 16383, 32, 4, 64), det));
  EXPECT_FALSE(ops::sm90_bwd_before_cudnn(call(1, 32768, 32768, 32, 4, 64), atomic));
  EXPECT_FALSE(ops::sm90_bwd_before_cudnn(s32k, atomic));
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 32768, 32768, 32, 4, 64), det),
            (Bwd{B::Sm90Kernel, B::CudnnTiles, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(call(1, 8192, 8192, 32, 4, 64)), det),
            (Bwd{B::CudnnTiles, B::Sm90Kernel, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(call(1, 4096, 4096, 32, 4, 64)), det),
            (Bwd{B::CudnnInPlace, B::CudnnOneCall, B::Sm90Kernel, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(s32k, atomic), (Bwd{B::CudnnTiles, B::Sm90Kernel, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(s32k), atomic),
            (Bwd{B::CudnnInPlace, B::CudnnTiles, B::Sm90Kernel, B::Kernel}));
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 64, 64, 4, 4, 64, true, 10), bare), (Bwd{B::Sm90Kernel, B::Kernel}));
  // Nothing to add stays nothing to add.
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 0, 16, 8, 8, 128), det), (Bwd{B::NoRows}));
  EXPECT_STREQ(ops::route_name(B::Sm90Kernel), "sm90 kernel");
  EXPECT_EQ(ops::describe_attention_route(s32k, det), "forward: sm90 kernel; backward: sm90 kernel (deterministic)");
  // Its scratch: the layout of kernels/attention_sm90_scratch.h (Sq padded to 128 rows, each
  // region 256-byte aligned), plus bf16 gradients for f32 ones.
  const AttentionCall b2 = call(2, 300, 300, 8, 2, 128);
  const ops::AttentionBwdScratch s = ops::attention_bwd_scratch(B::Sm90Kernel, b2, det);
  const int64_t acc = 2 * 8 * 384 * 128 * 4, vec = 2 * 8 * 384 * 4, sem = 512;  // 2 x 8 x 6 semaphores, rounded up
  EXPECT_EQ(s.sm90, acc + 2 * vec + sem);
  EXPECT_EQ(s.grads, 0);
  ASSERT_EQ(s.list().size(), 1u);
  EXPECT_EQ(s.list()[0].bytes, s.sm90);
  const ops::AttentionBwdScratch s32 = ops::attention_bwd_scratch(B::Sm90Kernel, f32(b2), det);
  EXPECT_EQ(s32.grads, (2 * 300 * 8 * 128 + 2 * 2 * 300 * 2 * 128) * 2);
  EXPECT_EQ(s32.list().size(), 2u);
}

TEST(AttentionRoute, RingBlocks) {
  const AttentionRouteOptions det = opts(true);
  // Off-diagonal steps: every key visible (causal past the diagonal, or not causal).
  for (const AttentionCall& c : {call(1, 4096, 4096, 32, 4, 64, true, 4096), call(1, 4096, 4096, 32, 4, 64, true, 4095),
                                 call(1, 77, 190, 8, 4, 64, false, 0)}) {
    EXPECT_EQ(ops::attention_fwd_routes(c, det), (Fwd{kUnmasked, kFwdKernel}));
    EXPECT_EQ(ops::attention_bwd_routes(c, det), (Bwd{AttentionBwdRoute::CudnnOneCall, AttentionBwdRoute::Kernel}));
    // A ring's fp32 accumulators: the same routes (no in-place write into f32 gradients).
    EXPECT_EQ(ops::attention_bwd_routes(overwriting(f32(c)), det),
              (Bwd{AttentionBwdRoute::CudnnOneCall, AttentionBwdRoute::Kernel}));
  }
  EXPECT_EQ(ops::attention_bwd_route(call(1, 16384, 16384, 32, 4, 64, false), det), AttentionBwdRoute::CudnnTiles);
  EXPECT_EQ(ops::attention_bwd_route(call(1, 16384, 16384, 32, 4, 64, false), opts(false)),
            AttentionBwdRoute::CudnnTiles);
  EXPECT_EQ(ops::attention_bwd_route(call(1, 8192, 8192, 32, 4, 64, false), opts(false)),
            AttentionBwdRoute::CudnnOneCall);
  // Partial masks (the diagonal inside the block, not at its corner): the kernels only.
  for (const AttentionCall& c : {call(1, 4096, 4096, 32, 4, 64, true, 4094), call(2, 150, 130, 8, 2, 128, true, 64),
                                 call(1, 128, 128, 4, 1, 64, true, -100), call(1, 200, 300, 4, 4, 64, true, 0)}) {
    EXPECT_EQ(ops::attention_fwd_routes(c, det), (Fwd{kFwdKernel}));
    EXPECT_EQ(ops::attention_bwd_routes(overwriting(c), det), (Bwd{AttentionBwdRoute::Kernel}));
  }
}

// Sliding windows: a call through ops::attention_call keeps the window only where it hides a key
// from a query of the block; such a call runs on our kernels (the Hopper one first on sm_90), a
// window that hides nothing routes as before.
TEST(AttentionRoute, SlidingWindows) {
  std::mt19937_64 rng(test_seed());
  auto effective = [](int64_t w, int64_t sq, int64_t sk, int64_t diag) {  // by definition, pair by pair
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        if (w > 0 && j <= i + diag - w) return w;
    return int64_t{0};
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t sq = 1 + static_cast<int64_t>(rng() % 40), sk = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t diag = static_cast<int64_t>(rng() % 121) - 60, w = static_cast<int64_t>(rng() % 70);
    EXPECT_EQ(ops::effective_window(w, sq, sk, diag), effective(w, sq, sk, diag))
        << "w " << w << " sq " << sq << " sk " << sk << " diag " << diag;
  }
  EXPECT_EQ(ops::effective_window(4096, 0, 10, 5000), 0);
  EXPECT_EQ(ops::effective_window(4096, 10, 0, 5000), 0);
  // Through attention_call: a one-GPU causal square of 128K with Mistral's 4K window keeps it; a
  // ring's diagonal chunk of 4K does not (every query sees every earlier key of its chunk).
  float x = 0;
  const ops::Tensor q(&x, ops::DType::BF16, {1, 131072, 32, 128}), k(&x, ops::DType::BF16, {1, 131072, 8, 128});
  ops::AttentionBlock blk;
  blk.window = 4096;
  const AttentionCall c = ops::attention_call(q, k, blk);
  EXPECT_EQ(c.window, 4096);
  EXPECT_FALSE(c.causal_square());
  EXPECT_FALSE(c.unmasked());
  const ops::Tensor q4(&x, ops::DType::BF16, {1, 4096, 32, 128}), k4(&x, ops::DType::BF16, {1, 4096, 8, 128});
  EXPECT_EQ(ops::attention_call(q4, k4, blk).window, 0);
  EXPECT_TRUE(ops::attention_call(q4, k4, blk).causal_square());
  blk.causal = false;  // an off-diagonal block 4096 positions before its queries: the window cuts it
  blk.q_offset = 4096;
  EXPECT_EQ(ops::attention_call(q4, k4, blk).window, 4096);
  blk.q_offset = 8192;  // wholly outside: the strategies never call it (documents.h), the router keeps the window
  EXPECT_EQ(ops::attention_call(q4, k4, blk).window, 4096);

  AttentionRouteOptions hop = opts(false);
  hop.sm90 = true;
  for (const AttentionRouteOptions& o : {opts(true), opts(false), opts(true, 0, false), hop}) {
    const Fwd fwd = o.sm90 ? Fwd{AttentionFwdRoute::Sm90Kernel, kFwdKernel} : Fwd{kFwdKernel};
    const Bwd bwd =
        o.sm90 ? Bwd{AttentionBwdRoute::Sm90Kernel, AttentionBwdRoute::Kernel} : Bwd{AttentionBwdRoute::Kernel};
    for (AttentionCall w : {c, call(2, 700, 900, 28, 4, 128, false, 1500), call(1, 512, 512, 32, 8, 64)}) {
      w.window = w.window > 0 ? w.window : 333;
      EXPECT_EQ(ops::attention_fwd_routes(w, o), fwd);
      EXPECT_EQ(ops::attention_bwd_routes(w, o), bwd);
      EXPECT_EQ(ops::attention_bwd_routes(overwriting(f32(w)), o), bwd);
    }
  }
  EXPECT_EQ(ops::describe_attention_route(c, hop),
            "forward: sm90 kernel (window 4096); backward: sm90 kernel (atomic dQ)");
  AttentionCall none = call(1, 64, 0, 4, 4, 64);
  none.window = 16;
  EXPECT_EQ(ops::attention_fwd_routes(none, hop), (Fwd{AttentionFwdRoute::NoKeys}));
  EXPECT_EQ(ops::attention_bwd_routes(none, hop), (Bwd{AttentionBwdRoute::NoRows}));
}

TEST(AttentionRoute, OptionsAndEmptyCalls) {
  const AttentionCall c = call(1, 65536, 65536, 32, 4, 64);
  EXPECT_EQ(ops::attention_fwd_routes(c, opts(true, 0, false)), (Fwd{kFwdKernel}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(c), opts(false, 0, false)), (Bwd{AttentionBwdRoute::Kernel}));
  // The backward tile decides one call or tiles (tests lower it to 1024).
  const AttentionCall s = call(1, 2304, 2304, 4, 2, 64);
  EXPECT_EQ(ops::attention_bwd_route(s, opts(true, 1024)), AttentionBwdRoute::CudnnTiles);
  EXPECT_EQ(ops::attention_bwd_route(s, opts(true, 0)), AttentionBwdRoute::CudnnOneCall);
  EXPECT_EQ(opts(false, 1024).tile(), 1024);
  // No keys / no rows.
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 64, 0, 4, 4, 64, false), opts()), (Fwd{AttentionFwdRoute::NoKeys}));
  EXPECT_EQ(ops::attention_fwd_routes(call(1, 0, 0, 4, 4, 64), opts()), (Fwd{AttentionFwdRoute::NoKeys}));
  EXPECT_EQ(ops::attention_bwd_routes(overwriting(call(1, 0, 64, 4, 4, 64, false)), opts(false)),
            (Bwd{AttentionBwdRoute::NoRows}));
  EXPECT_EQ(ops::attention_bwd_routes(call(1, 64, 0, 4, 4, 64), opts()), (Bwd{AttentionBwdRoute::NoRows}));
}

TEST(AttentionRoute, NamesAndDescription) {
  EXPECT_STREQ(ops::route_name(AttentionFwdRoute::CudnnCausalGraph), "cudnn causal graph");
  EXPECT_STREQ(ops::route_name(AttentionFwdRoute::CudnnCausalChunks), "cudnn causal in query chunks");
  EXPECT_STREQ(ops::route_name(AttentionFwdRoute::CudnnUnmasked), "cudnn unmasked");
  EXPECT_STREQ(ops::route_name(AttentionFwdRoute::Kernel), "kernel");
  EXPECT_STREQ(ops::route_name(AttentionFwdRoute::NoKeys), "no keys");
  EXPECT_STREQ(ops::route_name(AttentionBwdRoute::CudnnInPlace), "cudnn one call in place");
  EXPECT_STREQ(ops::route_name(AttentionBwdRoute::CudnnOneCall), "cudnn one call");
  EXPECT_STREQ(ops::route_name(AttentionBwdRoute::CudnnTiles), "cudnn tiles");
  EXPECT_STREQ(ops::route_name(AttentionBwdRoute::Kernel), "kernel");
  EXPECT_STREQ(ops::route_name(AttentionBwdRoute::NoRows), "no rows");
  EXPECT_EQ(ops::describe_attention_route(call(1, 65536, 65536, 32, 4, 64), opts()),
            "forward: cudnn causal graph; backward: cudnn tiles (4096 x 4096, 16 x 16 tiles, deterministic)");
  EXPECT_EQ(ops::describe_attention_route(overwriting(call(1, 65536, 65536, 32, 4, 64)), opts(false, 0, true, false)),
            "forward: cudnn causal in query chunks (4096 rows each); backward: cudnn one call in place (atomic dQ)");
  EXPECT_EQ(ops::describe_attention_route(call(1, 100, 100, 4, 4, 64, true, 10), opts()),
            "forward: kernel; backward: kernel");
  // The call of tensors and a block.
  float x[1] = {0};
  const ops::Tensor q(x, ops::DType::BF16, {2, 300, 8, 128}), k(x, ops::DType::BF16, {2, 200, 2, 128});
  ops::AttentionBlock blk;
  blk.q_offset = 300;
  blk.k_offset = 100;
  blk.accumulate = false;
  const AttentionCall c = ops::attention_call(q, k, blk, true);
  EXPECT_EQ(c.batch, 2);
  EXPECT_EQ(c.sq, 300);
  EXPECT_EQ(c.sk, 200);
  EXPECT_EQ(c.hq, 8);
  EXPECT_EQ(c.hkv, 2);
  EXPECT_EQ(c.hd, 128);
  EXPECT_EQ(c.diag, 200);
  EXPECT_TRUE(c.causal && c.f32_grads && !c.accumulate && c.unmasked() && !c.causal_square());
}

TEST(AttentionRoute, ScratchOfEachRoute) {
  // Query chunks of a 64K causal square, 32 x 128: t = 4096.
  const ops::CausalChunkScratch ch = ops::causal_chunk_scratch(call(1, 65536, 65536, 32, 32, 128));
  EXPECT_EQ(ch.rows, 4096);
  EXPECT_EQ(ch.acc_o, 4096 * 32 * 128 * 4);
  EXPECT_EQ(ch.acc_lse, 32 * 4096 * 4);
  EXPECT_EQ(ch.blk_o, 4096 * 32 * 128 * 2);
  EXPECT_EQ(ch.blk_lse, 32 * 4096 * 4);
  EXPECT_EQ(ops::attention_fwd_scratch(kChunks, call(1, 65536, 65536, 32, 32, 128)).size(), 4u);
  EXPECT_TRUE(ops::attention_fwd_scratch(kGraph, call(1, 65536, 65536, 32, 32, 128)).empty());

  // Tiles, deterministic, GQA 32/4 x 64 at 64K: qrow 2048, krow 256, T 4096.
  const AttentionCall c = call(1, 65536, 65536, 32, 4, 64);
  const ops::AttentionBwdScratch t = ops::attention_bwd_scratch(AttentionBwdRoute::CudnnTiles, c, opts());
  EXPECT_EQ(t.tile, 4096);
  EXPECT_EQ(t.grads, int64_t{4096} * (2048 + 2 * 256) * 2);
  EXPECT_EQ(t.dq_acc, int64_t{65536} * 2048 * 4);
  EXPECT_EQ(t.dkv_acc, 2 * 4096 * 256 * 4);
  EXPECT_EQ(t.delta, 0);
  // workspace of one tile: softmax sum + dP + the GQA per-head dK/dV
  const int64_t ws = 4 * 32 * 4096 + 2 * 32 * int64_t{4096} * 4096 + 4 * 4096 * 2048;
  EXPECT_EQ(t.cudnn_workspace.bytes, ws);
  EXPECT_EQ(ops::cudnn_bwd_workspace(1, 4096, 4096, 32, 4, 64, true), ws);
  const std::vector<ops::ScratchBuffer> tl = t.list();
  ASSERT_EQ(tl.size(), 4u);
  EXPECT_EQ(tl[0].name, "attention bwd: bf16 tile gradients");
  EXPECT_EQ(tl[1].name, "attention bwd: dQ accumulator (f32)");
  EXPECT_EQ(tl[2].name, "attention bwd: dK/dV of a key tile (f32)");
  EXPECT_EQ(tl[3].name, "attention bwd: cuDNN workspace (softmax sum, dP tile)");
  // A ring's fp32 gradients: no dQ accumulator of its own.
  const ops::AttentionBwdScratch tf = ops::attention_bwd_scratch(AttentionBwdRoute::CudnnTiles, f32(c), opts());
  EXPECT_EQ(tf.dq_acc, 0);
  EXPECT_EQ(tf.list().size(), 3u);
  // Atomic: the dQ accumulator in the workspace instead of dP, rows rounded as cuDNN does.
  EXPECT_EQ(ops::cudnn_bwd_workspace(2, 100, 300, 8, 8, 128, false),
            (4 * 2 * 8 * 100 + 255) / 256 * 256 + 4 * 2 * 100 * 1024);
  EXPECT_EQ(ops::cudnn_bwd_workspace(1, 100, 300, 8, 8, 128, true), 3328 + 2 * 8 * 128 * 320);  // 3200 up to 256

  // One call: the block's bf16 gradients, B 2, 300 x 300, 8/2 x 128.
  const AttentionCall b = call(2, 300, 300, 8, 2, 128);
  const ops::AttentionBwdScratch one = ops::attention_bwd_scratch(AttentionBwdRoute::CudnnOneCall, b, opts());
  EXPECT_EQ(one.grads, (2 * 300 * 1024 + 2 * 2 * 300 * 256) * 2);
  EXPECT_EQ(one.cudnn_workspace.bytes, ops::cudnn_bwd_workspace(2, 300, 300, 8, 2, 128, true));
  EXPECT_EQ(one.list().size(), 2u);
  // In place: cuDNN's workspace only.
  const ops::AttentionBwdScratch ip = ops::attention_bwd_scratch(AttentionBwdRoute::CudnnInPlace, b, opts(false));
  EXPECT_EQ(ip.grads + ip.dq_acc + ip.dkv_acc + ip.delta, 0);
  EXPECT_EQ(ip.cudnn_workspace.bytes, ops::cudnn_bwd_workspace(2, 300, 300, 8, 2, 128, false));
  ASSERT_EQ(ip.list().size(), 1u);
  EXPECT_NE(ip.list()[0].formula.find("in place"), std::string::npos);
  // Kernel: delta, and bf16 scratch for fp32 gradients only.
  const ops::AttentionBwdScratch k = ops::attention_bwd_scratch(AttentionBwdRoute::Kernel, b, opts());
  EXPECT_EQ(k.grads, 0);
  EXPECT_EQ(k.delta, 2 * 8 * 300 * 4);
  EXPECT_EQ(k.cudnn_workspace.bytes, 0);
  EXPECT_EQ(ops::attention_bwd_scratch(AttentionBwdRoute::Kernel, f32(b), opts()).grads, one.grads);
  EXPECT_TRUE(ops::attention_bwd_scratch(AttentionBwdRoute::NoRows, b, opts()).list().empty());
}

TEST(ScratchSpec, OtherScratchOfTheBackends) {
  // LM head: Llama 3's vocabulary, 64K tokens: the tile capped at 2^26 logits (CUDA), 2^24 (CPU);
  // on CUDA at least 1024 rows (past 2^26 logits for vocabularies above 64K), Llama 2's 32K
  // vocabulary still at 2^26 logits (2097 rows).
  const int64_t V = 128256, n = 65536;
  EXPECT_EQ(ops::lm_head_tile_rows(0, n, V, ops::kCudaMaxTileLogits), (int64_t{1} << 26) / V);
  EXPECT_EQ(ops::lm_head_tile_rows(256, n, V, ops::kCudaMaxTileLogits), 256);
  EXPECT_EQ(ops::lm_head_tile_rows(0, 100, 1000, ops::kCudaMaxTileLogits), 100);
  EXPECT_EQ(ops::lm_head_tile_rows(0, 5, int64_t{1} << 30, ops::kCpuMaxTileLogits), 1);
  const ops::LmHeadScratch g = ops::cuda_lm_head_scratch(n, V, 0, true, true);
  EXPECT_EQ(g.tile_rows, 1024);
  EXPECT_EQ(g.logits, 4 * 1024 * V);
  EXPECT_EQ(g.grad, 2 * 1024 * V);
  EXPECT_EQ(ops::cuda_lm_head_scratch(n, 151936, 4096, true, true).tile_rows, 1024);
  EXPECT_EQ(ops::cuda_lm_head_scratch(n, 32000, 4096, true, true).tile_rows, (int64_t{1} << 26) / 32000);
  EXPECT_EQ(ops::cuda_lm_head_scratch(n, 151936, 512, true, true).tile_rows, 512);
  EXPECT_EQ(g.nll, (n + 2) * 8);
  EXPECT_EQ(g.list().size(), 3u);
  EXPECT_EQ(ops::cuda_lm_head_scratch(n, V, 0, false, true).grad, 0);  // forward only
  EXPECT_EQ(ops::cuda_lm_head_scratch(n, V, 0, true, false).grad, 0);  // f32: in place
  const ops::LmHeadScratch c = ops::cpu_lm_head_scratch(n, V, 0, 4);
  EXPECT_EQ(c.tile_rows, (int64_t{1} << 24) / V);
  EXPECT_EQ(c.logits, c.tile_rows * V * 4);
  EXPECT_EQ(c.nll, n * 8);
  // RMSNorm backward: per-64-row dw partials.
  EXPECT_EQ(ops::rmsnorm_bwd_scratch(100, 4096).chunks, 2);
  EXPECT_EQ(ops::rmsnorm_bwd_scratch(100, 4096).dw_partials, 2 * 4096 * 4);
  EXPECT_EQ(ops::rmsnorm_bwd_scratch(128, 4096, false).dw_partials, 0);
  EXPECT_EQ(ops::rmsnorm_dw_chunks(129), 3);
  // Embedding backward, sum of squares, the backend's own.
  EXPECT_EQ(ops::embedding_bwd_scratch(1000).ids, 12000);
  EXPECT_EQ(ops::embedding_bwd_scratch(1000).sort_temp_estimate, 8000 + (1 << 20));
  EXPECT_EQ(ops::sum_squares_scratch().bytes, 8 * 1025);
  EXPECT_EQ(ops::sum_squares_scratch().blocks, 1024);
  EXPECT_EQ(ops::cuda_own_bytes().total(), (32 << 20) + 4);
  EXPECT_EQ(ops::cuda_own_bytes(1 << 20).cublas_workspace, 1 << 20);
}

// A backend with several attention routes: the CPU's ops, one made-up route per direction.
class RoutedCpu final : public ops::Backend {
 public:
  std::unique_ptr<ops::Backend> in = ops::make_cpu_backend();
  std::string attention_route(const AttentionCall& c, bool backward) const override {
    if (!backward) return "fwd";
    return std::string("bwd") + (c.f32_grads ? " f32" : "") + (c.accumulate ? "" : " overwrite");
  }
  const char* name() const override { return "routed"; }
  ops::MemSpace memspace() const override { return in->memspace(); }
  ops::Buffer allocate(ops::DType t, int64_t n, const char* w) override { return in->alloc(t, n, w); }
  ops::MemoryStats memory_stats() const override { return in->memory_stats(); }
  void reset_peak_memory() override { in->reset_peak_memory(); }
  void copy_on(Queue& q, const ops::Tensor& d, const ops::Tensor& s) override { in->copy_on(q, d, s); }
  ops::Buffer allocate_host_pinned(ops::DType t, int64_t n, const char* w) override {
    return in->alloc_host_pinned(t, n, w);
  }
  ops::CopyFence copy_async(const ops::Tensor& d, const ops::Tensor& s) override { return in->copy_async(d, s); }
  void wait_copy(ops::CopyFence f) override { in->wait_copy(f); }
  void copy(const ops::Tensor& d, const ops::Tensor& s) override { in->copy(d, s); }
  void copy_2d(const ops::Tensor& d, int64_t dp, const ops::Tensor& s, int64_t sp, int64_t r, int64_t w) override {
    in->copy_2d(d, dp, s, sp, r, w);
  }
  void fill(const ops::Tensor& x, double v) override { in->fill(x, v); }
  void axpy(const ops::Tensor& y, const ops::Tensor& x, double a) override { in->axpy(y, x, a); }
  void scale(const ops::Tensor& x, double a) override { in->scale(x, a); }
  double sum_squares(const ops::Tensor& x) override { return in->sum_squares(x); }
  void embedding_fwd(const ops::Tensor& i, const ops::Tensor& t, const ops::Tensor& o) override {
    in->embedding_fwd(i, t, o);
  }
  void embedding_bwd(const ops::Tensor& i, const ops::Tensor& d, const ops::Tensor& t) override {
    in->embedding_bwd(i, d, t);
  }
  void rmsnorm_fwd(const ops::Tensor& x, const ops::Tensor& w, double e, const ops::Tensor& y,
                   const ops::Tensor& r) override {
    in->rmsnorm_fwd(x, w, e, y, r);
  }
  void rmsnorm_bwd(const ops::Tensor& x, const ops::Tensor& w, const ops::Tensor& r, const ops::Tensor& dy,
                   const ops::Tensor& dx, const ops::Tensor& dw) override {
    in->rmsnorm_bwd(x, w, r, dy, dx, dw);
  }
  void matmul(const ops::Tensor& a, bool ta, const ops::Tensor& b, bool tb, const ops::Tensor& c, double al,
              double be) override {
    in->matmul(a, ta, b, tb, c, al, be);
  }
  void rope(const ops::Tensor& x, const ops::Tensor& p, const ops::Tensor& f, bool inv) override {
    in->rope(x, p, f, inv);
  }
  void attention_fwd(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::AttentionBlock& b,
                     const ops::Tensor& o, const ops::Tensor& l) override {
    in->attention_fwd(q, k, v, b, o, l);
  }
  void attention_bwd(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                     const ops::Tensor& l, const ops::Tensor& d, const ops::AttentionBlock& b, const ops::Tensor& dq,
                     const ops::Tensor& dk, const ops::Tensor& dv) override {
    in->attention_bwd(q, k, v, o, l, d, b, dq, dk, dv);
  }
  void attention_merge(const ops::Tensor& o, const ops::Tensor& l, const ops::Tensor& ob,
                       const ops::Tensor& lb) override {
    in->attention_merge(o, l, ob, lb);
  }
  void swiglu_fwd(const ops::Tensor& g, const ops::Tensor& u, const ops::Tensor& h) override {
    in->swiglu_fwd(g, u, h);
  }
  void swiglu_bwd(const ops::Tensor& g, const ops::Tensor& u, const ops::Tensor& dh, const ops::Tensor& dg,
                  const ops::Tensor& du) override {
    in->swiglu_bwd(g, u, dh, dg, du);
  }
  ops::LossSums lm_head_loss(const ops::Tensor& x, const ops::Tensor& w, const ops::Tensor& l, int64_t t, double s,
                             const ops::Tensor& dx, const ops::Tensor& dw) override {
    return in->lm_head_loss(x, w, l, t, s, dx, dw);
  }
  void adamw(const ops::Tensor& p, const ops::Tensor& g, const ops::Tensor& m, const ops::Tensor& v,
             const ops::AdamWStep& s) override {
    in->adamw(p, g, m, v, s);
  }
};

TEST_F(OpsFixture, ProfileKeysNameTheAttentionRoute) {
  const int64_t S = 16, H = 4, Hk = 2, hd = 8;
  ops::Buffer q = rand(ops::DType::F32, S * H * hd), k = rand(ops::DType::F32, S * Hk * hd),
              v = rand(ops::DType::F32, S * Hk * hd), dout = rand(ops::DType::F32, S * H * hd);
  ops::Buffer o = be->alloc(ops::DType::F32, S * H * hd), lse = be->alloc(ops::DType::F32, H * S),
              dq = be->alloc(ops::DType::F32, S * H * hd), dk = be->alloc(ops::DType::F32, S * Hk * hd),
              dv = be->alloc(ops::DType::F32, S * Hk * hd);
  ops::AttentionBlock blk;
  blk.scale = 0.3;
  blk.accumulate = false;
  auto qv = [&](ops::Buffer& b) { return b.view({1, S, H, hd}); };
  auto kv = [&](ops::Buffer& b) { return b.view({1, S, Hk, hd}); };
  for (bool routed : {false, true}) {
    std::unique_ptr<ops::Backend> inner;
    if (routed) inner = std::make_unique<RoutedCpu>();
    else inner = ops::make_cpu_backend();
    ops::ProfilingBackend prof(std::move(inner));
    prof.set_enabled(true);
    prof.attention_fwd(qv(q), kv(k), kv(v), blk, qv(o), lse.view({1, H, S}));
    prof.attention_bwd(qv(q), kv(k), kv(v), qv(o), lse.view({1, H, S}), qv(dout), blk, qv(dq), kv(dk), kv(dv));
    prof.collect();
    std::map<std::string, int64_t> calls;
    for (const ops::OpProfileRow& r : prof.rows()) calls[r.key] = r.calls;
    const std::string tag_f = routed ? " [fwd]" : "", tag_b = routed ? " [bwd f32 overwrite]" : "";
    EXPECT_EQ(calls["attention_fwd causal 16x16 4/2x8" + tag_f], 1) << calls.begin()->first;
    EXPECT_EQ(calls["attention_bwd causal 16x16 4/2x8" + tag_b], 1) << calls.rbegin()->first;
    EXPECT_EQ(prof.attention_route(ops::attention_call(qv(q), kv(k), blk), false), routed ? "fwd" : "");
  }
}

}  // namespace
}  // namespace easyctx::test
