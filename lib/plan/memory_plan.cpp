#include "plan/memory_plan.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "model/llama.h"
#include "model/param_layout.h"
#include "plan/plan_detail.h"
#include "plan/recorder.h"
#include "zero/param_store.h"
#include "zero/shard_layout.h"

namespace easyctx::plan {
using model::BufferSpec;
namespace {

using ops::DType;

std::string num(int64_t v) { return std::to_string(v); }

// ---------------------------------------------------------------------------------------
// The run being planned: model, shapes, layout.
// ---------------------------------------------------------------------------------------
struct Run {
  const StageConfig& cfg;
  model::LlamaConfig mc;
  model::ParamLayout layout;
  dist::GroupLayout groups;
  bool cuda = false;
  DType dtype = DType::F32;  // activations and working parameters
  int64_t e = 4;             // bytes per activation element
  int64_t P = 0;             // parameters
  int64_t B = 1, S = 0, n = 0;  // sequences per micro-batch, local tokens per sequence, tokens
  int64_t Z = 1;             // ZeRO-3 shard group size (1: stage 0)
  std::string dev;           // where the backend allocates: "gpu" (CUDA) or "host" (CPU)

  explicit Run(const StageConfig& c) : cfg(c), mc(model::resolve_llama_config(c.model)), layout(mc) {}
  bool zero3() const { return cfg.parallel.zero.stage == 3; }
  bool offload_opt() const { return cfg.parallel.zero.offload_optimizer && cuda; }
  // ZeRO-3's cut of the units over Z ranks (every rank's shards have the same lengths).
  zero::ShardLayout shards() const { return zero::ShardLayout(layout, static_cast<int>(Z), 0); }
};

// data::sp_local_length (lib/data is not a dependency of lib/plan; tests/plan checks that
// the two agree): tokens of one sequence on one rank, padded to what the layout needs.
int64_t local_length(const StageConfig& cfg, int sp) {
  const int64_t L = cfg.data.seq_length;
  if (sp == 1) return L;
  const SeqParallelMode m = cfg.parallel.sequence.mode;
  const int64_t mult = (m == SeqParallelMode::Ulysses || m == SeqParallelMode::DistFlash) ? sp : 2 * int64_t{sp};
  return (L + mult - 1) / mult * mult / sp;
}

// ---------------------------------------------------------------------------------------
// Items.
// ---------------------------------------------------------------------------------------
class Items {
 public:
  std::vector<PlanItem> list;
  std::vector<std::string> phase_order{"init", "step"};

  void persistent(const std::string& when, const std::string& name, const std::string& where, int64_t bytes,
                  const std::string& formula, bool tracked = true) {
    if (bytes > 0) list.push_back({name, where, bytes, formula, false, when, tracked});
  }
  void transient(const std::string& phase, const std::string& name, const std::string& where, int64_t bytes,
                 const std::string& formula, bool tracked = true) {
    if (bytes <= 0) return;
    if (std::find(phase_order.begin(), phase_order.end(), phase) == phase_order.end()) phase_order.push_back(phase);
    list.push_back({name, where, bytes, formula, true, phase, tracked});
  }
};

// Replays the allocations of one call (a sequence-parallel attention forward, ...) and
// keeps the live set at its peak: those become the transient items of a phase.
class Replay {
 public:
  struct Entry {
    std::string name, formula;
    int64_t bytes;
  };
  int alloc(const std::string& name, int64_t bytes, const std::string& formula) {
    live_.push_back({next_, {name, formula, bytes}});
    total_ += bytes;
    if (total_ > peak_) {
      peak_ = total_;
      snapshot_.clear();
      for (const auto& l : live_) snapshot_.push_back(l.second);
    }
    return next_++;
  }
  void free(int id) {
    for (auto it = live_.begin(); it != live_.end(); ++it)
      if (it->first == id) {
        total_ -= it->second.bytes;
        live_.erase(it);
        return;
      }
  }
  void scratch(const std::string& name, int64_t bytes, const std::string& formula) { free(alloc(name, bytes, formula)); }
  const std::vector<Entry>& at_peak() const { return snapshot_; }

 private:
  std::vector<std::pair<int, Entry>> live_;
  std::vector<Entry> snapshot_;
  int64_t total_ = 0, peak_ = 0;
  int next_ = 0;
};

// The attention work of one rank, replayed allocation by allocation (the buffers of
// lib/attention/sequence_parallel.cpp, the CUDA backend's attention scratch). Sequences of
// a batch run one at a time, so one sequence's replay is the peak.
class AttentionReplay {
 public:
  // groups: activation.attention_head_groups (the inner strategy sees 1/groups of the heads).
  AttentionReplay(const Run& r, Replay& rp, int64_t groups)
      : r_(r), rp_(rp), hq_(r.mc.num_heads / groups), hkv_(r.mc.num_kv_heads / groups), hd_(r.mc.head_dim) {}
  int64_t hq() const { return hq_; }
  int64_t hkv() const { return hkv_; }

  // HeadGroupedAttention's packed copies of one head group (allocated for the whole call):
  // q, k, v, o, LSE forward; also dout, dq, dk, dv backward. Returns their ids.
  std::vector<int> head_group_packs(bool backward) {
    const int64_t n = r_.B * r_.S, e = r_.e, q = n * hq_ * hd_, kv = n * hkv_ * hd_;
    const std::string t = "head group packs: ";
    std::vector<int> ids;
    ids.push_back(rp_.alloc(t + (backward ? "q, o, dout" : "q, o"), e * q * (backward ? 3 : 2),
                            backward ? "3 x e x n x Hq/G x hd" : "2 x e x n x Hq/G x hd"));
    ids.push_back(rp_.alloc(t + "k, v", 2 * e * kv, "2 x e x n x Hkv/G x hd"));
    ids.push_back(rp_.alloc(t + "LSE", 4 * r_.B * hq_ * r_.S, "4 x B x Hq/G x S"));
    if (backward) ids.push_back(rp_.alloc(t + "dq, dk, dv", e * (q + 2 * kv), "e x n x (Hq + 2 Hkv)/G x hd"));
    return ids;
  }

  // CUDA attention_bwd scratch for one block of b x sq queries and b x sk keys, through
  // cuDNN's composite backward (CudaBackend::cudnn_bwd), T = ops::attention_bwd_tile: a
  // block of at most T x T is one call that keeps the block's bf16 gradients and cuDNN's
  // workspace (softmax sum f32[b, Hq, sq]; deterministic: dP bf16[b, Hq, sq, sk], else the
  // dQ accumulator f32[b, sq, Hq, hd]); a larger one runs in T x T tiles: bf16 tile
  // gradients, a key tile's fp32 dK/dV, the fp32 dQ accumulator of one sequence (unless the
  // gradients are fp32: a ring's accumulators) and the workspace of one tile.
  // (A causal square needs the same buffers as a full block: it only skips tiles.)
  // `overwrite` (LocalAttention's single block, blk.accumulate false, bf16 gradients): one call
  // writes the gradients in place, no scratch but the workspace, for any length with atomic
  // dQ and up to T x T deterministic (CudaBackend::cudnn_bwd_in_place).
  void bwd_scratch(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, bool f32_grads,
                   bool overwrite = false) {
    if (!r_.cuda) return;  // the CPU kernels keep per-thread rows on the heap (small)
    const bool det = r_.cfg.train.deterministic;
    const int64_t T = ops::attention_bwd_tile(det), qrow = hq * hd_, krow = hkv * hd_;
    auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
    // cuDNN's own part with GQA: the per-query-head dK/dV of the graph, bf16[2, b, Hq, cols,
    // hd] before the group reduction (measured on H200: the 1B shape's peak grows by 4 S Hq hd
    // bytes over the tiles' sum, the 7B's MHA by nothing).
    auto cudnn_ws = [&](int64_t bb, int64_t rows, int64_t cols) {
      return up(4 * bb * hq * rows, 256) + (det ? 2 * bb * hq * up(rows, 64) * up(cols, 64) : 4 * bb * rows * qrow) +
             (hq != hkv ? 4 * bb * cols * qrow : 0);
    };
    const std::string ws_name = std::string("attention bwd: cuDNN workspace (softmax sum, ") +
                                (det ? "dP tile)" : "dQ accumulator)");
    const std::string gqa_f = hq != hkv ? " + 4 x cols x Hq x hd (GQA)" : "";
    const std::string ws_f = (det ? "4 x Hq x rows + 2 x Hq x rows x cols" : "4 x Hq x rows + 4 x rows x Hq x hd") + gqa_f;
    if (overwrite && !f32_grads && (!det || (sq <= T && sk <= T))) {
      rp_.scratch(ws_name, cudnn_ws(b, sq, sk), ws_f + " (one call, gradients in place)");
      return;
    }
    if (sq > T || sk > T) {
      std::vector<int> ids;
      ids.push_back(rp_.alloc("attention bwd: bf16 tile gradients", 2 * T * (qrow + 2 * krow),
                              "2 x T x (Hq + 2 Hkv) x hd, T = " + num(T)));
      if (!f32_grads) ids.push_back(rp_.alloc("attention bwd: dQ accumulator (f32)", 4 * sq * qrow, "4 x S x Hq x hd"));
      ids.push_back(rp_.alloc("attention bwd: dK/dV of a key tile (f32)", 8 * T * krow, "2 x 4 x T x Hkv x hd"));
      rp_.scratch(ws_name, cudnn_ws(1, T, T), ws_f);
      for (int id : ids) rp_.free(id);
      return;
    }
    const int g = rp_.alloc("attention bwd: bf16 block gradients", 2 * b * (sq * qrow + 2 * sk * krow),
                            "2 x (q + 2 k) block elements");
    rp_.scratch(ws_name, cudnn_ws(b, sq, sk), ws_f);
    rp_.free(g);
  }

  // A causal square's forward (one GPU's sequence, a ring's step 0) runs cuDNN's causal graph
  // in one call, without scratch of its own (CudaBackend::causal_square_cudnn). Only where
  // cuDNN declines that graph does CudaBackend::causal_in_chunks keep one query chunk's
  // accumulators, 6 t Hq hd + 8 Hq t bytes (t = ops::causal_chunk_rows(s) <= 8192: at most
  // 0.2 GiB for 32 x 128), not planned.
  void local(bool backward) {
    if (backward) bwd_scratch(r_.B, r_.S, r_.S, hq_, hkv_, false, true);
  }

  // ZigzagRingAttention::forward_one / backward_one on s local tokens (c = s/2 per chunk).
  void zigzag(int64_t s, int64_t hq, int64_t hkv, bool backward, const std::string& tag) {
    const int64_t c = s / 2, e = r_.e, qc = c * hq * hd_, kvs = s * hkv * hd_;
    std::vector<int> ids;
    auto add = [&](const std::string& n, int64_t b, const std::string& f) { ids.push_back(rp_.alloc(tag + n, b, f)); };
    if (!backward) {
      add("running output x2 (f32)", 2 * 4 * qc, "2 x 4 x c x Hq x hd");
      add("running LSE x2", 2 * 4 * hq * c, "2 x 4 x Hq x c");
      add("block output", e * qc, "e x c x Hq x hd");
      add("block LSE", 4 * hq * c, "4 x Hq x c");
      add("K/V double buffer", 4 * e * kvs, "2 x 2 x e x S x Hkv x hd");
    } else {
      add("LSE chunks x2", 2 * 4 * hq * c, "2 x 4 x Hq x c");
      add("dQ accumulator (f32)", 4 * s * hq * hd_, "4 x S x Hq x hd");
      add("K/V double buffer", 4 * e * kvs, "2 x 2 x e x S x Hkv x hd");
      add("dK/dV accumulators x2 (f32, travel with K/V)", 4 * 4 * kvs, "2 x 2 x 4 x S x Hkv x hd");
      bwd_scratch(1, c, c, hq, hkv, true);  // every block is c x c
    }
    for (int id : ids) rp_.free(id);
  }

  // DistFlashAttention::forward / backward, W ranks, c local tokens.
  void dist_flash(int W, bool backward) {
    const int64_t c = r_.S, e = r_.e, q = c * hq_ * hd_, kv = c * hkv_ * hd_;
    const std::string t = "dist_flash ";
    const bool helper = W - 1 >= W / 2 + 1;  // the helper loop (later queries on our keys) runs
    std::vector<int> ids;
    auto add = [&](const std::string& n, int64_t b, const std::string& f) { ids.push_back(rp_.alloc(t + n, b, f)); };
    if (!backward) {
      add("output accumulator (f32)", 4 * q, "4 x c x Hq x hd");
      add("block output", e * q, "e x c x Hq x hd");
      add("block LSE", 4 * hq_ * c, "4 x Hq x c");
      add("received K, V", 2 * e * kv, "2 x e x c x Hkv x hd");
      add("received query", e * q, "e x c x Hq x hd");
      if (helper) {
        const int a = rp_.alloc(t + "returned output", e * q, "e x c x Hq x hd");
        rp_.scratch(t + "returned LSE", 4 * hq_ * c, "4 x Hq x c");
        rp_.free(a);
      }
    } else {
      add("dQ/dK/dV accumulators (f32)", 4 * (q + 2 * kv), "4 x c x (Hq + 2 Hkv) x hd");
      bwd_scratch(1, c, c, hq_, hkv_, true);
      add("received K, V", 2 * e * kv, "2 x e x c x Hkv x hd");
      add("dK/dV partials and received (f32)", 4 * 4 * kv, "4 x 4 x c x Hkv x hd");
      bwd_scratch(1, c, c, hq_, hkv_, true);
      add("received q, o, dout", 3 * e * q, "3 x e x c x Hq x hd");
      add("received LSE", 4 * hq_ * c, "4 x Hq x c");
      add("dQ partial and received (f32)", 2 * 4 * q, "2 x 4 x c x Hq x hd");
      if (helper) bwd_scratch(1, c, c, hq_, hkv_, true);
    }
    for (int id : ids) rp_.free(id);
  }

  // UlyssesAttention::forward / backward, U ranks; inner: local attention, or (usp) a zigzag
  // ring over the head-sharded sequence of s x U tokens.
  void ulysses(int U, bool ring, bool backward) {
    const int64_t s = r_.S, e = r_.e, sg = s * U;
    const int64_t nq = hq_ / U;
    const int64_t nkv = hkv_ % U == 0 ? hkv_ / U : 1;
    const std::string t = ring ? "usp " : "ulysses ";
    std::vector<int> ids;
    // to_heads: send and receive buffers of the all-to-all; the receive buffer is kept.
    auto to_heads = [&](const std::string& n, int64_t heads) {
      const int64_t b = e * sg * heads * hd_;
      const int send = rp_.alloc(t + "all-to-all send", b, "e x S x U x heads x hd");
      ids.push_back(rp_.alloc(t + n + " (head-sharded)", b, "e x S x U x heads/U x hd"));
      rp_.free(send);
    };
    // from_heads: the receive buffer; where several ranks held one kv head (Hkv < U), the sum
    // of their gradients goes through one rank's block.
    auto from_heads = [&](int64_t heads, bool shared = false) {
      const int recv = rp_.alloc(t + "all-to-all receive", e * sg * heads * hd_, "e x S x U x heads/U x hd");
      if (shared) rp_.scratch(t + "shared kv head sum", e * s * heads * hd_, "e x S x heads/U x hd");
      rp_.free(recv);
    };
    if (!backward) {
      to_heads("q", nq);
      to_heads("k", nkv);
      to_heads("v", nkv);
      ids.push_back(rp_.alloc(t + "o (head-sharded)", e * sg * nq * hd_, "e x S x U x Hq/U x hd"));
      ids.push_back(rp_.alloc(t + "LSE (head-sharded)", 4 * nq * sg, "4 x Hq/U x S x U"));
      if (ring) zigzag(sg, nq, nkv, false, "usp ring ");
      from_heads(nq);
      rp_.scratch(t + "LSE all-to-all send", 4 * nq * sg, "4 x Hq/U x S x U");
    } else {
      to_heads("q", nq);
      to_heads("k", nkv);
      to_heads("v", nkv);
      to_heads("o", nq);
      to_heads("dout", nq);
      const int recv = rp_.alloc(t + "LSE all-to-all receive", 4 * nq * sg, "4 x Hq/U x S x U");
      ids.push_back(rp_.alloc(t + "LSE (head-sharded)", 4 * nq * sg, "4 x Hq/U x S x U"));
      rp_.free(recv);
      ids.push_back(rp_.alloc(t + "dq, dk, dv (head-sharded)", e * sg * (nq + 2 * nkv) * hd_,
                              "e x S x U x (Hq + 2 Hkv)/U x hd"));
      if (ring) zigzag(sg, nq, nkv, true, "usp ring ");
      else bwd_scratch(1, sg, sg, nq, nkv, false, true);
      from_heads(nq);
      from_heads(nkv, hkv_ % U != 0);
    }
    for (int id : ids) rp_.free(id);
  }

 private:
  const Run& r_;
  Replay& rp_;
  int64_t hq_, hkv_, hd_;
};

// The attention phase's transient items (forward or backward) for the run's SP mode.
void attention_items(const Run& r, bool backward, Items& it) {
  Replay rp;
  const int64_t groups = r.cfg.activation.attention_head_groups;
  AttentionReplay a(r, rp, groups);
  const std::vector<int> packs = groups > 1 ? a.head_group_packs(backward) : std::vector<int>{};
  const int sp = r.groups.sp_size;
  if (sp == 1) {
    a.local(backward);
  } else {
    switch (r.cfg.parallel.sequence.mode) {
      case SeqParallelMode::ZigzagRing:
        a.zigzag(r.S, a.hq(), a.hkv(), backward, "zigzag_ring ");
        break;
      case SeqParallelMode::DistFlash: a.dist_flash(sp, backward); break;
      case SeqParallelMode::Ulysses: a.ulysses(sp, false, backward); break;
      case SeqParallelMode::Usp: a.ulysses(r.groups.ulysses_size, true, backward); break;  // inner ring, any size
      case SeqParallelMode::None: break;
    }
  }
  for (int id : packs) rp.free(id);
  const std::string phase = backward ? "attention backward" : "attention forward";
  for (const Replay::Entry& en : rp.at_peak()) it.transient(phase, en.name, r.dev, en.bytes, en.formula);
}

// Checks what the strategies check at run time, so a plan never promises an impossible run.
void check_heads(const Run& r) {
  const int64_t G = r.cfg.activation.attention_head_groups;
  EASYCTX_CHECK_INPUT(r.mc.num_kv_heads % G == 0, "activation.attention_head_groups: ", G,
                      " does not divide the model's key/value heads (", r.mc.num_kv_heads, ")");
  const SeqParallelMode m = r.cfg.parallel.sequence.mode;
  if (r.groups.sp_size == 1 || (m != SeqParallelMode::Ulysses && m != SeqParallelMode::Usp)) return;
  const int64_t U = r.groups.ulysses_size, hq = r.mc.num_heads / G, hkv = r.mc.num_kv_heads / G;
  const std::string per = G > 1 ? " per head group" : "";
  EASYCTX_CHECK_INPUT(hq % U == 0, "ulysses: parallel.sequence.size (", U, ") must divide the attention heads", per,
                      " (", hq, ")");
  EASYCTX_CHECK_INPUT(hkv % U == 0 || U % hkv == 0, "ulysses: parallel.sequence.size (", U,
                      ") must divide the key/value heads", per, " (", hkv, ") or be a multiple of them");
  const int64_t sg = r.S * U;
  EASYCTX_CHECK_INPUT(m != SeqParallelMode::Usp || sg % 2 == 0, "usp: the head-sharded sequence (", sg,
                      " tokens) must hold two equal chunks");
}

// ---------------------------------------------------------------------------------------
// The model's workspace, grouped for the table ("acts.3.h1" -> "acts.*.h1").
// ---------------------------------------------------------------------------------------
struct Group {
  std::string key, base;
  DType dtype;
  int64_t numel = 0;  // per buffer
  int64_t count = 0;
  bool pinned_host = false;  // offloaded checkpoints (BufferSpec::pinned_host)
};

std::vector<Group> group_specs(const std::vector<BufferSpec>& specs) {
  std::vector<Group> out;
  for (const BufferSpec& s : specs) {
    std::string key, base;
    for (const std::string& part : split(s.name, '.')) {
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      key += (key.empty() ? "" : ".") + (digits ? std::string("*") : part);
      if (!digits) base = part;
    }
    auto it = std::find_if(out.begin(), out.end(), [&](const Group& g) { return g.key == key && g.numel == s.numel; });
    if (it == out.end()) out.push_back({key, base, s.dtype, s.numel, 1, s.pinned_host});
    else ++it->count;
  }
  return out;
}

// Symbolic shape of a workspace buffer by its name (informational; numbers are exact).
std::string shape_of(const Group& g, const Run& r) {
  static const std::map<std::string, std::string> shapes = {
      {"resid", "n x D"}, {"h1", "n x D"}, {"x_mid", "n x D"}, {"h2", "n x D"}, {"hf", "n x max(D, Hq x hd) (doubles as dattn)"},
      {"dx", "n x D"}, {"dh", "n x D"}, {"rstd1", "n"}, {"rstd2", "n"}, {"rstd_f", "n"}, {"q", "n x Hq x hd"},
      {"o", "n x Hq x hd"}, {"dattn", "n x Hq x hd"}, {"dq", "n x Hq x hd"}, {"saved_o", "n x Hq x hd"},
      {"k", "n x Hkv x hd"}, {"v", "n x Hkv x hd"}, {"dk", "n x Hkv x hd"}, {"dv", "n x Hkv x hd"},
      {"lse", "B x Hq x S"}, {"saved_lse", "B x Hq x S"}, {"embed_grad_scratch", "V x D"},
      {"embed_grad_f32", "V x D"}};
  static const char* mlp[] = {"g", "u", "m", "dm", "dg", "du"};
  for (const char* m : mlp)
    if (g.base == m) return g.numel == r.n * r.mc.intermediate_size ? "n x I" : "mlp_tile x I";
  auto it = shapes.find(g.base);
  return it == shapes.end() ? num(g.numel) : it->second;
}

std::string workspace_label(const Group& g) {
  static const std::map<std::string, std::string> what = {
      {"resid", "residual stream (layer inputs kept for backward)"},
      {"saved_o", "attention-output checkpoints"},
      {"saved_lse", "attention-LSE checkpoints"},
      {"embed_grad_scratch", "embedding-gradient scratch (bf16, f32_grads)"},
      {"embed_grad_f32", "embedding-gradient scratch (f32 copy)"},
  };
  auto it = what.find(g.base);
  std::string name = "workspace " + g.key + (it != what.end() ? ": " + it->second : "");
  if (g.count > 1) name += " x" + num(g.count);
  return name;
}

// LlamaModel::workspace_specs for the run (the ModelOptions Trainer::init builds).
std::vector<BufferSpec> model_buffers(const Run& r) {
  model::ModelOptions mo;
  mo.checkpoint = r.cfg.activation.checkpoint;
  mo.lm_head_tile = r.cfg.activation.lm_head_tile;
  mo.mlp_tile = r.cfg.activation.mlp_tile;
  mo.f32_grads = r.cuda;
  mo.offload_checkpoints = r.cfg.activation.offload == OffloadTarget::Cpu;
  mo.offload_layers = r.cfg.activation.offload_layers;
  return model::LlamaModel::workspace_specs(r.mc, mo, r.dtype, r.B, r.S, true);
}

// ---------------------------------------------------------------------------------------
// The parameter store and the model, replayed.
// ---------------------------------------------------------------------------------------
// Same-label buffers as one item: "label" with the bytes summed and their count.
void add_recorded(Items& it, bool transient, const std::string& phase, const std::vector<AllocRecorder::Entry>& entries,
                  const std::string& where, bool tracked, const std::string& source) {
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> groups;  // label -> (bytes, count)
  for (const AllocRecorder::Entry& e : entries) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == e.what; });
    if (g == groups.end()) g = groups.insert(groups.end(), {e.what, {0, 0}});
    g->second.first += e.bytes;
    g->second.second += 1;
  }
  for (const auto& [what, bc] : groups) {
    const std::string f = num(bc.second) + (bc.second == 1 ? " buffer" : " buffers") + " (replay of " + source + ")";
    if (transient) it.transient(phase, what, where, bc.first, f, tracked);
    else it.persistent(phase, what, where, bc.first, f, tracked);
  }
}

// The model's construction and the parameter store's set-up (zero/param_store.h: the state
// as loaded, then cut_shards) run on recording backends: what is live afterwards is the
// persistent set of "init"; what the cut frees on the way (the whole units as loaded) makes
// the init phase's peak, one item per memory.
void parameter_items(const Run& r, const PlanTarget& t, Items& it) {
  AllocRecorder dev, host;
  RecordingOptions ro;
  ro.space = r.cuda ? MemSpace::Device : MemSpace::Host;
  ro.pinned = r.cuda ? &host : nullptr;
  ro.deterministic = r.cfg.train.deterministic;
  const std::unique_ptr<ops::Backend> be = make_recording_backend(dev, ro);
  zero::StoreOptions so = zero::store_options(r.cfg);
  so.host_backend = [&host] { return make_recording_backend(host, {}); };
  const MemSpace cs = r.cuda ? MemSpace::Device : MemSpace::Host;  // NCCL with CUDA, else MPI
  const int W = t.world(), G = r.groups.sp_size > 1 ? W : r.groups.dp_size, R = W / static_cast<int>(r.Z);
  const auto world = make_recording_comm("world", W, 0, cs), grads = make_recording_comm("grads", G, 0, cs);
  const auto zero = make_recording_comm("zero", static_cast<int>(r.Z), 0, cs);
  const auto replica = make_recording_comm("zero_replica", R, 0, cs);
  {
    const model::LlamaModel model(r.mc, *be, r.dtype, model::options_for(r.cfg, r.cuda));
    const std::unique_ptr<zero::ParamStore> store = zero::make_param_store(
        r.layout, *be, r.dtype, so, {world.get(), grads.get(), zero.get(), R > 1 ? replica.get() : nullptr});
    store->cut_shards();
    const std::string src = r.zero3() ? "zero/sharded_store.cpp" : "zero/replicated_store.cpp";
    add_recorded(it, false, "init", dev.live(), r.dev, true, src);
    add_recorded(it, false, "init", host.live(), "host", !r.cuda, src);
    it.transient("init", "parameter set-up: whole units as loaded, before the shards are cut", r.dev,
                 dev.peak_bytes() - dev.live_bytes(), "peak of the replay of " + src);
    it.transient("init", "host copy of the whole master weights as loaded (f32), less the shards", "host",
                 host.peak_bytes() - host.live_bytes(), "peak of the replay of " + src, false);
  }
}

}  // namespace

namespace detail {

MemoryPlan plan_core(const StageConfig& cfg, const PlanTarget& t) {
  EASYCTX_CHECK(t.backend != DeviceKind::Auto, "plan_memory: the target's backend must be resolved (cpu or cuda)");
  validate_activation(cfg);
  Run r(cfg);
  r.cuda = t.backend == DeviceKind::Cuda;
  r.dtype = r.cuda ? DType::BF16 : DType::F32;
  r.e = r.cuda ? 2 : 4;
  r.dev = r.cuda ? "gpu" : "host";
  r.P = r.layout.total_numel();
  try {
    r.groups = dist::make_group_layout(cfg, t.world(), t.gpus_per_node);
  } catch (const InputError& e) {
    EASYCTX_THROW_INPUT("target world ", t.nodes, " node(s) x ", t.gpus_per_node, " = ", t.world(),
                        " rank(s) (target.nodes x target.gpus_per_node, or the launch): ", e.what());
  }
  r.Z = r.zero3() ? (cfg.parallel.zero.group == ZeroGroupScope::Node ? r.groups.ranks_per_node : t.world()) : 1;
  r.B = cfg.train.batch_size;
  r.S = local_length(cfg, r.groups.sp_size);
  r.n = r.B * r.S;
  check_heads(r);
  const model::LlamaConfig& mc = r.mc;
  const int64_t P = r.P, n = r.n, D = mc.hidden_size, V = mc.vocab_size, L = mc.num_layers;
  const std::string dev = r.dev;
  Items it;

  // ---- process and backend constants
  if (r.cuda) {
    it.persistent("init", "CUDA context, cuBLASLt/cuDNN handles, NCCL (constant)", "gpu", kCudaContextBytes,
                  "kCudaContextBytes (calibrated; not a backend allocation)", false);
    it.persistent("init", "cuBLASLt workspace + error flag", "gpu", kCublasWorkspaceBytes + 4, "32 MiB + 4 B");
  }
  it.persistent("init", "process baseline (program, libraries, MPI" + std::string(r.cuda ? ", CUDA host side)" : ")"),
                "host", r.cuda ? kHostBaselineCudaBytes : kHostBaselineCpuBytes,
                r.cuda ? "kHostBaselineCudaBytes (calibrated)" : "kHostBaselineCpuBytes (calibrated)", false);

  // ---- the model, parameters, gradients, optimizer state (replayed)
  parameter_items(r, t, it);

  // ---- weights loading (Trainer::load_weights): on CUDA every unit is staged on the host
  if (r.cuda && !r.offload_opt() && !r.zero3())
    it.transient("init", "host staging of the weights being loaded (f32)", "host", 4 * P, "4 P", false);

  // ---- the first step: micro-batch on the device, the model's workspace
  if (r.cuda)
    it.persistent("step", "micro-batch on the device (tokens, positions, labels)", "gpu", 3 * 4 * n, "3 x 4 x n");
  const int64_t mb = cfg.train.grad_accum * (3 * 4 * n + 8 * r.B);
  it.persistent("step", "loader micro-batches (int32 tokens, positions, labels)", "host", mb,
                "grad_accum x (3 x 4 x n + 8 B)", false);
  for (const Group& g : group_specs(model_buffers(r))) {
    const int64_t each = g.numel * static_cast<int64_t>(ops::element_size(g.dtype));
    const std::string f = (g.count > 1 ? num(g.count) + " x " : "") + shape_of(g, r) + " x " +
                          num(static_cast<int64_t>(ops::element_size(g.dtype)));
    if (g.pinned_host) {  // activation.offload cpu: Backend::alloc_host_pinned (a backend buffer on the CPU)
      it.persistent("step", workspace_label(g) + (r.cuda ? " (offloaded, pinned)" : " (offloaded)"), "host",
                    g.count * each, f, !r.cuda);
      continue;
    }
    it.persistent("step", workspace_label(g), dev, g.count * each, f);
  }

  // ---- transient phases of a step
  attention_items(r, false, it);
  attention_items(r, true, it);
  const int64_t ht = cfg.activation.lm_head_tile > 0 ? std::min(cfg.activation.lm_head_tile, n) : n;
  if (r.cuda) {
    // CudaBackend::lm_head_loss: the tile holds at most 2^26 f32 logits.
    const int64_t tile = std::max<int64_t>(1, std::min(ht, (int64_t{1} << 26) / std::max<int64_t>(1, V)));
    const std::string tf = " (tile = " + num(tile) + " = min(lm_head_tile, n, 2^26 / V))";
    it.transient("LM head + loss", "logits tile f32" + tf, "gpu", 4 * tile * V, "4 x tile x V");
    it.transient("LM head + loss", "logits gradient tile bf16", "gpu", 2 * tile * V, "2 x tile x V");
    it.transient("LM head + loss", "per-token NLL f64", "gpu", 8 * (n + 2), "8 x (n + 2)");
    // rmsnorm_bwd: per-chunk dw partials of 64 rows
    it.transient("RMSNorm backward", "dw partials f32", "gpu", 4 * ((n + 63) / 64) * D, "4 x ceil(n / 64) x D");
    it.transient("embedding backward", "sorted ids, order, iota", "gpu", 3 * 4 * n, "3 x 4 x n");
    it.transient("embedding backward", "cub radix-sort temp (estimate)", "gpu", 8 * n + (int64_t{1} << 20),
                 "~ 8 n + 1 MiB");
    it.transient("gradient clip", "sum-of-squares partials", "gpu", 8 * 1025, "8 x 1025");
  } else {
    // cpu::lm_head_loss keeps its tile and the per-token NLL on the heap (not backend buffers).
    const int64_t cap = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, V));
    const int64_t tile = std::max<int64_t>(1, std::min(ht, cap));
    it.transient("LM head + loss", "logits tile f32 (heap; tile = " + num(tile) + ")", "host", 4 * tile * V,
                 "4 x min(lm_head_tile, n, 2^24 / V) x V", false);
    it.transient("LM head + loss", "per-token NLL f64 (heap)", "host", 8 * n, "8 x n", false);
  }

  // ---- gradient reduction over MPI (the CPU backend): MpiComm sums floats in rank order
  // through heap copies, unit by unit: all_reduce holds the padded send, the received blocks
  // and its own block; reduce_scatter the received blocks (then the replicas' all_reduce).
  if (!r.cuda) {
    int64_t unit = 0;
    for (size_t u = 0; u < r.layout.num_units(); ++u) unit = std::max(unit, r.layout.units()[u].numel);
    const int64_t len = r.shards().max_len();
    auto all_reduce = [](int64_t count, int64_t ranks) {
      const int64_t block = (count + ranks - 1) / ranks;
      return 4 * (2 * block * ranks + block);
    };
    const int64_t G = r.groups.sp_size > 1 ? t.world() : r.groups.dp_size, R = t.world() / r.Z;
    int64_t bytes = 0;
    if (!r.zero3() && G > 1) bytes = all_reduce(unit, G);
    if (r.zero3() && r.Z > 1) bytes = 4 * len * r.Z;
    if (r.zero3() && R > 1) bytes = std::max(bytes, all_reduce(len, R));
    it.transient("gradient reduce", "MPI rank-ordered sum buffers (heap, largest unit)", "host", bytes,
                 r.zero3() ? "4 x Z x ceil(unit / Z)" : "4 x (2 G + 1) x ceil(unit / G), G = ranks summing", false);
  }

  // ---- host staging of checkpoints and the export (CUDA stage 0: this rank's slices)
  if (r.cuda && !r.offload_opt() && (cfg.output.save_final || cfg.output.save_every > 0)) {
    const int64_t W = t.world();
    const int64_t state = r.zero3() ? r.shards().total_len() : (P + W - 1) / W;
    const std::string f = r.zero3() ? "3 x 4 x sum ceil(unit / Z)" : "3 x 4 x P / W (the slices this rank writes)";
    it.transient("checkpoint save", "host staging of master, m, v (f32)", "host", 12 * state, f, false);
  }
  if (r.cuda && !r.offload_opt() && cfg.output.export_hf && !r.zero3())
    it.transient("HF export (rank 0)", "host staging of the master weights (f32)", "host", 4 * P, "4 P", false);
  if (r.zero3() && cfg.output.export_hf) {  // Trainer::master_host: every rank gathers the whole model
    it.transient("HF export (gather)", "the whole master weights on every rank (f32, heap)", "host", 4 * P, "4 P",
                 false);
    if (r.cuda) {
      const int64_t len = r.shards().max_len();
      it.transient("HF export (gather)", "one unit gathered on the device (f32)", "gpu", 4 * r.Z * len,
                   "4 x Z x max ceil(unit / Z)");
    }
  }

  // ---- totals per phase
  MemoryPlan p;
  p.target = t;
  p.model_name = mc.name;
  p.parameters = P;
  p.world = t.world();
  p.dp = r.groups.dp_size;
  p.sp = r.groups.sp_size;
  p.zero_group = static_cast<int>(r.Z);
  p.local_len = r.S;
  p.tokens = n;
  p.items = it.list;
  for (const std::string& ph : it.phase_order) {
    PhaseTotal pt{ph == "step" ? "steady (between ops)" : ph, 0, 0, 0};
    for (const PlanItem& i : p.items) {
      const bool live = i.transient ? i.phase == ph : (ph != "init" || i.phase == "init");
      if (!live) continue;
      if (i.tracked && i.where == dev) pt.alloc_bytes += i.bytes;
      (i.where == "gpu" ? pt.gpu_bytes : pt.host_bytes) += i.bytes;
    }
    p.phases.push_back(pt);
  }
  for (const PhaseTotal& pt : p.phases) {
    if (pt.alloc_bytes > p.alloc_peak_bytes) p.alloc_peak_bytes = pt.alloc_bytes, p.alloc_peak_phase = pt.name;
    if (pt.gpu_bytes > p.gpu_peak_bytes) p.gpu_peak_bytes = pt.gpu_bytes, p.gpu_peak_phase = pt.name;
    if (pt.host_bytes > p.host_rank_peak_bytes) p.host_rank_peak_bytes = pt.host_bytes, p.host_peak_phase = pt.name;
  }
  p.context_bytes = r.cuda ? kCudaContextBytes : 0;
  p.host_peak_bytes = static_cast<int64_t>(t.gpus_per_node) * p.host_rank_peak_bytes + p.host_shared_bytes;
  p.gpu_capacity = r.cuda ? t.gpu_memory_bytes : 0;
  p.gpu_usable = static_cast<int64_t>(static_cast<double>(p.gpu_capacity) * (1.0 - t.headroom));
  p.host_capacity = t.host_memory_bytes;
  p.host_usable = static_cast<int64_t>(static_cast<double>(p.host_capacity) * (1.0 - t.headroom));
  p.gpu_fits = !r.cuda || p.gpu_peak_bytes <= p.gpu_usable;
  p.host_fits = p.host_peak_bytes <= p.host_usable;
  p.fits = p.gpu_fits && p.host_fits;
  return p;
}

}  // namespace detail

MemoryPlan plan_memory(const StageConfig& cfg, const PlanTarget& target) {
  MemoryPlan p = detail::plan_core(cfg, target);
  if (!p.fits) p.knobs = detail::search_knobs(cfg, target, p.tokens);
  return p;
}

MemoryPlan plan_for_run(const StageConfig& cfg, int world_size, int ranks_per_node) {
  return plan_memory(cfg, run_target(cfg, world_size, ranks_per_node));
}

}  // namespace easyctx::plan
