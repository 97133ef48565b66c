// The Hopper attention kernels the router can run, and which one each call takes, as small pure
// functions in plain C++ (no CUDA: the CPU unit tests check every choice). The measurements
// behind each choice: docs/performance.md, "Hopper attention".
#pragma once
#include <cstdint>
#include <vector>

namespace easyctx::kernels {

// Forward kernels (kernels/attention_fwd_sm90.cu). Both run FlashAttention-3's ping-pong: two or
// three consumer warpgroups take turns issuing their GEMMs, one's softmax under the other's GEMMs.
//   Persistent: head dim 128; two consumers (128-row tiles) in persistent CTAs, one per SM,
//               walking a longest-first work list in L2 sections (no launch tail, the next
//               tile's loads under this one's epilogue);
//   Wide:       head dim 64; three consumers on 192-row tiles, one CTA per tile (a K/V tile
//               feeds 1.5x the rows; 3 x 160 registers cannot hold hd 128's O);
//   Auto:       sm90_fwd_variant_for(hd).
enum class Sm90FwdVariant { Persistent, Wide, Auto };

// The forward kernel for head dim hd: the fastest measured at each head dim (hd 64: wide, its
// three consumers keep the tensor cores busier than two; hd 128: persistent).
constexpr Sm90FwdVariant sm90_fwd_variant_for(int64_t hd) {
  return hd == 64 ? Sm90FwdVariant::Wide : Sm90FwdVariant::Persistent;
}

// The concrete variant Auto stands for at head dim hd (others: themselves).
constexpr Sm90FwdVariant sm90_fwd_resolve(Sm90FwdVariant v, int64_t hd) {
  return v == Sm90FwdVariant::Auto ? sm90_fwd_variant_for(hd) : v;
}

// Whether v runs head dim hd (each kernel is built for the one head dim it is chosen for).
constexpr bool sm90_fwd_variant_supported(Sm90FwdVariant v, int64_t hd) {
  if (hd != 64 && hd != 128) return false;
  return sm90_fwd_resolve(v, hd) == sm90_fwd_variant_for(hd);
}

constexpr const char* sm90_fwd_variant_name(Sm90FwdVariant v) {
  switch (v) {
    case Sm90FwdVariant::Persistent: return "persistent";
    case Sm90FwdVariant::Wide: return "wide";
    case Sm90FwdVariant::Auto: return "auto";
  }
  return "?";
}

// Every concrete forward variant (not Auto), in the order the bench prints them.
inline std::vector<Sm90FwdVariant> sm90_fwd_variants() { return {Sm90FwdVariant::Persistent, Sm90FwdVariant::Wide}; }

// Backward kernels (kernels/attention_bwd_sm90.cu), both with FlashAttention-3's split dQ: each
// consumer computes half of dQ over all 128 keys of its CTA (hd 128: half the columns, hd 64:
// half the rows of 128-row steps), so there are no partials to sum.
//   AtomicSplit:        dQ added by TMA bulk reduce-adds as it comes (fp32 order varies);
//   DeterministicSplit: dQ added in a fixed order per query tile behind a semaphore, so the
//                       result is bit-identical run to run.
enum class Sm90BwdVariant { AtomicSplit, DeterministicSplit };

// The backward kernel of the backend's mode (train.deterministic).
constexpr Sm90BwdVariant sm90_bwd_variant_for(bool deterministic) {
  return deterministic ? Sm90BwdVariant::DeterministicSplit : Sm90BwdVariant::AtomicSplit;
}

constexpr const char* sm90_bwd_variant_name(Sm90BwdVariant v) {
  return v == Sm90BwdVariant::DeterministicSplit ? "deterministic-split" : "atomic-split";
}

constexpr bool sm90_bwd_variant_deterministic(Sm90BwdVariant v) { return v == Sm90BwdVariant::DeterministicSplit; }

constexpr bool sm90_bwd_variant_supported(Sm90BwdVariant, int64_t hd) { return hd == 64 || hd == 128; }

// Every backward variant, in bench order.
inline std::vector<Sm90BwdVariant> sm90_bwd_variants() {
  return {Sm90BwdVariant::AtomicSplit, Sm90BwdVariant::DeterministicSplit};
}

}  // namespace easyctx::kernels
