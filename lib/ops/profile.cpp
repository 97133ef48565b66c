#include "ops/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "ops/attention_route.h"

namespace easyctx::ops {
namespace {

// The host's wall clock around each op: exact for backends that finish an op before returning.
class WallTimer final : public OpTimer {
 public:
  void begin() override { t0_ = Clock::now(); }
  void end() override { ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0_).count()); }
  std::vector<double> collect() override { return std::exchange(ms_, {}); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
  std::vector<double> ms_;
};

const char* dname(DType t) { return type_name(t); }

std::string fmt(const char* f, long long a, long long b = 0, long long c = 0, long long d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), f, a, b, c, d);
  return buf;
}

// "[n, D] bf16": the leading dims folded into rows.
std::string rows_cols(const Tensor& t) {
  const int64_t cols = t.ndim > 0 ? t.dim(-1) : 1;
  return fmt("%lldx%lld ", t.numel() / std::max<int64_t>(cols, 1), cols) + dname(t.dtype);
}

std::string block_kind(int64_t sq, int64_t sk, const AttentionBlock& blk) {
  const int64_t d = blk.q_offset - blk.k_offset;
  if (!blk.causal || d >= sk - 1) return "full";
  if (d == 0 && sq == sk) return "causal";
  return "partial";
}

std::string attn_detail(const Tensor& q, const Tensor& k, const AttentionBlock& blk) {
  std::string s = block_kind(q.dim(1), k.dim(1), blk) + fmt(" %lldx%lld", q.dim(1), k.dim(1)) +
                  fmt(" %lld/%lldx%lld", q.dim(2), k.dim(2), q.dim(3));
  if (q.dim(0) > 1) s += fmt(" B=%lld", q.dim(0));
  return s;
}

// " [route]" where the backend has several (Backend::attention_route), else "".
std::string route_tag(const std::string& route) { return route.empty() ? route : " [" + route + "]"; }

double attn_flops(const Tensor& q, const Tensor& k, const AttentionBlock& blk) {
  return 4.0 * attention_pairs(q.dim(1), k.dim(1), blk) * static_cast<double>(q.dim(0) * q.dim(2) * q.dim(3));
}

}  // namespace

std::unique_ptr<OpTimer> Backend::make_op_timer() { return std::make_unique<WallTimer>(); }

double attention_pairs(int64_t sq, int64_t sk, const AttentionBlock& blk) {
  if (!blk.causal) return static_cast<double>(sq) * static_cast<double>(sk);
  // Row i sees min(max(i + d + 1, 0), sk) keys, d = q_offset - k_offset.
  const double d = static_cast<double>(blk.q_offset - blk.k_offset), Sq = static_cast<double>(sq),
               Sk = static_cast<double>(sk);
  const double lo = std::max(0.0, -d);            // first row that sees a key
  const double full = std::max(0.0, Sk - d - 1);  // first row that sees every key
  const double hi = std::min(Sq, full);           // rows [lo, hi) see i + d + 1 keys
  double pairs = 0;
  if (hi > lo) pairs += (hi - lo) * (d + 1) + (lo + hi - 1) * (hi - lo) / 2;
  if (Sq > full) pairs += (Sq - std::max(full, 0.0)) * Sk;
  return pairs;
}

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner)
    : inner_(std::move(inner)), timer_(inner_->make_op_timer()) {}

ProfilingBackend::~ProfilingBackend() = default;

template <typename F>
auto ProfilingBackend::timed(const char* key_prefix, const std::string& detail, double flops, F&& f) {
  if (!enabled_) return f();
  std::string key = detail.empty() ? std::string(key_prefix) : std::string(key_prefix) + " " + detail;
  auto it = index_.find(key);
  if (it == index_.end()) {
    it = index_.emplace(key, static_cast<int64_t>(totals_.size())).first;
    totals_.push_back(OpProfileRow{key});
  }
  pending_.emplace_back(it->second, flops);
  timer_->begin();
  struct End {
    OpTimer& t;
    ~End() { t.end(); }
  } end{*timer_};
  return f();
}

void ProfilingBackend::collect() {
  const std::vector<double> ms = timer_->collect();
  EASYCTX_CHECK(ms.size() == pending_.size(), "profile: ", ms.size(), " timings for ", pending_.size(), " ops");
  for (size_t i = 0; i < ms.size(); ++i) {
    OpProfileRow& r = totals_[static_cast<size_t>(pending_[i].first)];
    ++r.calls;
    r.ms += ms[i];
    r.flops += pending_[i].second;
  }
  pending_.clear();
}

std::vector<OpProfileRow> ProfilingBackend::rows() const {
  std::vector<OpProfileRow> v;
  for (const OpProfileRow& r : totals_)
    if (r.calls > 0) v.push_back(r);
  std::stable_sort(v.begin(), v.end(), [](const OpProfileRow& a, const OpProfileRow& b) { return a.ms > b.ms; });
  return v;
}

double ProfilingBackend::total_ms() const {
  double t = 0;
  for (const OpProfileRow& r : totals_) t += r.ms;
  return t;
}

void ProfilingBackend::copy(const Tensor& dst, const Tensor& src) {
  const bool dd = dst.space == MemSpace::Device, sd = src.space == MemSpace::Device;
  const char* dir = dd ? (sd ? "D2D" : "H2D") : (sd ? "D2H" : "H2H");
  timed("copy", std::string(dname(src.dtype)) + "->" + dname(dst.dtype) + " " + dir + fmt(" %lld", dst.numel()), 0,
        [&] { inner_->copy(dst, src); });
}
void ProfilingBackend::copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
                               int64_t width) {
  timed("copy_2d", std::string(dname(dst.dtype)) + fmt(" %lld", rows) + fmt("x%lld", width), 0,
        [&] { inner_->copy_2d(dst, dst_pitch, src, src_pitch, rows, width); });
}
void ProfilingBackend::fill(const Tensor& x, double value) {
  timed("fill", std::string(dname(x.dtype)), 0, [&] { inner_->fill(x, value); });
}
void ProfilingBackend::axpy(const Tensor& y, const Tensor& x, double alpha) {
  timed("axpy", std::string(dname(x.dtype)) + "->" + dname(y.dtype), 0, [&] { inner_->axpy(y, x, alpha); });
}
void ProfilingBackend::scale(const Tensor& x, double alpha) {
  timed("scale", std::string(dname(x.dtype)), 0, [&] { inner_->scale(x, alpha); });
}
double ProfilingBackend::sum_squares(const Tensor& x) {
  return timed("sum_squares", std::string(dname(x.dtype)), 0, [&] { return inner_->sum_squares(x); });
}
void ProfilingBackend::embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) {
  timed("embedding_fwd", rows_cols(out), 0, [&] { inner_->embedding_fwd(ids, table, out); });
}
void ProfilingBackend::embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  timed("embedding_bwd", rows_cols(dout), 0, [&] { inner_->embedding_bwd(ids, dout, dtable); });
}
void ProfilingBackend::rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  timed("rmsnorm_fwd", rows_cols(x), 0, [&] { inner_->rmsnorm_fwd(x, w, eps, y, rstd); });
}
void ProfilingBackend::rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                   const Tensor& dx, const Tensor& dw) {
  timed("rmsnorm_bwd", rows_cols(x) + "->" + dname(dx.dtype), 0, [&] { inner_->rmsnorm_bwd(x, w, rstd, dy, dx, dw); });
}
void ProfilingBackend::matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                              double alpha, double beta) {
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), kk = trans_a ? a.dim(0) : a.dim(1);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  std::string d = std::string(trans_a ? "T" : "N") + (trans_b ? "T" : "N") + fmt(" %lldx%lldx%lld ", m, n, kk) +
                  dname(a.dtype) + "->" + dname(c.dtype) + (beta != 0 ? " +C" : "");
  timed("matmul", d, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kk),
        [&] { inner_->matmul(a, trans_a, b, trans_b, c, alpha, beta); });
}
void ProfilingBackend::rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse) {
  timed(inverse ? "rope_bwd" : "rope_fwd", rows_cols(x), 0, [&] { inner_->rope(x, positions, inv_freq, inverse); });
}
void ProfilingBackend::attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                                     const Tensor& o, const Tensor& lse) {
  const std::string route = enabled_ ? inner_->attention_route(attention_call(q, k, blk), false) : "";
  timed("attention_fwd", attn_detail(q, k, blk) + route_tag(route), attn_flops(q, k, blk),
        [&] { inner_->attention_fwd(q, k, v, blk, o, lse); });
}
void ProfilingBackend::attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse, const Tensor& dout, const AttentionBlock& blk, const Tensor& dq,
                                     const Tensor& dk, const Tensor& dv) {
  const bool f32_grads = dq.dtype == DType::F32 && dk.dtype == DType::F32 && dv.dtype == DType::F32;
  const std::string route = enabled_ ? inner_->attention_route(attention_call(q, k, blk, f32_grads), true) : "";
  timed("attention_bwd", attn_detail(q, k, blk) + route_tag(route), 2.5 * attn_flops(q, k, blk),
        [&] { inner_->attention_bwd(q, k, v, o, lse, dout, blk, dq, dk, dv); });
}
void ProfilingBackend::attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o_blk, const Tensor& lse_blk) {
  timed("attention_merge", rows_cols(o), 0, [&] { inner_->attention_merge(o, lse, o_blk, lse_blk); });
}
void ProfilingBackend::swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& h) {
  timed("swiglu_fwd", rows_cols(g), 0, [&] { inner_->swiglu_fwd(g, u, h); });
}
void ProfilingBackend::swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dh, const Tensor& dg,
                                  const Tensor& du) {
  timed("swiglu_bwd", rows_cols(g), 0, [&] { inner_->swiglu_bwd(g, u, dh, dg, du); });
}
LossSums ProfilingBackend::lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens,
                                        double grad_scale, const Tensor& dx, const Tensor& dw) {
  const double one = 2.0 * static_cast<double>(x.numel()) * static_cast<double>(w.dim(0));  // 2 n V D
  const double flops = one * (1 + (dx.empty() ? 0 : 1) + (dw.empty() ? 0 : 1));
  std::string d = rows_cols(x) + fmt(" V=%lld tile %lld", w.dim(0), tile_tokens) +
                  (dx.empty()   ? ""
                   : dw.empty() ? " +dx"
                                : " +dx +dw");
  return timed("lm_head_loss", d, flops,
               [&] { return inner_->lm_head_loss(x, w, labels, tile_tokens, grad_scale, dx, dw); });
}
void ProfilingBackend::lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens,
                                     const Tensor& nll, const Tensor& top) {
  const double flops = 2.0 * static_cast<double>(x.numel()) * static_cast<double>(w.dim(0));  // 2 n V D
  timed("lm_head_score", rows_cols(x) + fmt(" V=%lld tile %lld", w.dim(0), tile_tokens), flops,
        [&] { inner_->lm_head_score(x, w, labels, tile_tokens, nll, top); });
}
void ProfilingBackend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                             const AdamWStep& s) {
  timed("adamw", std::string(dname(param.dtype)), 0, [&] { inner_->adamw(param, grad, m, v, s); });
}

}  // namespace easyctx::ops
