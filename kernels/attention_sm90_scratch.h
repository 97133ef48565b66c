// The device scratch of the Hopper attention backward (kernels/attention_bwd_sm90.cu), in plain
// C++ so that the attention router (lib/ops/attention_route.cpp, compiled in every build) sizes
// the route's scratch, and with it the memory plan, from the same layout the kernel uses.
#pragma once
#include <cstdint>

namespace easyctx::kernels {

// Byte offsets of the regions, each 256-byte aligned, for batch x hq query heads of sq rows at
// head dim hd: the fp32 dQ accumulator [B, Hq, Sq_pad, hd] (Sq_pad = Sq rounded up to 128 rows,
// the widest query step: hd 64's split variants), in 64-row tiles, lse in base 2 and delta, f32
// [B, Hq, Sq_pad] each, and the deterministic variant's semaphores, one per 64-row tile, i32
// [B, Hq, Sq_pad / 64].
struct Sm90BwdScratchLayout {
  int64_t sq_pad = 0, m_blocks = 0;
  int64_t acc_bytes = 0, vec_bytes = 0, sem_bytes = 0;
  int64_t total = 0;  // acc + lse2 + delta + semaphores
};

constexpr int64_t kSm90BwdQueryTile = 64;  // the dQ accumulator's tile (and a semaphore's rows)
constexpr int64_t kSm90BwdRowPad = 128;    // rows are padded to the widest step

inline Sm90BwdScratchLayout sm90_bwd_scratch_layout(int64_t batch, int64_t hq, int64_t sq, int64_t hd) {
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  Sm90BwdScratchLayout s;
  s.sq_pad = up(sq, kSm90BwdRowPad);
  s.m_blocks = s.sq_pad / kSm90BwdQueryTile;
  const int64_t bh = batch * hq;
  s.acc_bytes = up(bh * s.sq_pad * hd * 4, 256);
  s.vec_bytes = up(bh * s.sq_pad * 4, 256);
  s.sem_bytes = up(bh * s.m_blocks * 4, 256);
  s.total = s.acc_bytes + 2 * s.vec_bytes + s.sem_bytes;
  return s;
}

}  // namespace easyctx::kernels
