// RoPE's frequencies and attention factor as transformers computes them for each rope_scaling
// (default, linear, llama3, yarn, dynamic), in fp32 where torch computes in fp32.
#include <algorithm>
#include <cmath>

#include "model/llama_config.h"

namespace easyctx::model {

double LlamaConfig::yarn_factor() const {
  return rope_scaling.has_original ? static_cast<double>(max_position_embeddings) /
                                         static_cast<double>(rope_scaling.original_max_position_embeddings)
                                   : rope_scaling.factor;
}

double LlamaConfig::rope_attention_factor() const {
  if (rope_scaling.kind != RopeScalingKind::Yarn) return 1.0;
  if (rope_scaling.attention_factor > 0) return rope_scaling.attention_factor;
  const double f = yarn_factor();
  auto get_mscale = [&](double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; };
  if (rope_scaling.mscale != 0 && rope_scaling.mscale_all_dim != 0)
    return get_mscale(rope_scaling.mscale) / get_mscale(rope_scaling.mscale_all_dim);
  return get_mscale(1.0);
}

namespace {
// transformers' _compute_yarn_parameters: a ramp between interpolated (1 / factor) and
// extrapolated frequencies over the dimensions between the correction bounds, in fp32 where
// torch computes in fp32 (the bounds in double, as Python's math).
void yarn_inv_freq(const LlamaConfig& c, std::vector<float>& f) {
  const RopeScaling& r = c.rope_scaling;
  const double base = c.rope_theta, dim = static_cast<double>(c.head_dim);
  const double orig =
      static_cast<double>(r.has_original ? r.original_max_position_embeddings : c.max_position_embeddings);
  const float factor = static_cast<float>(c.yarn_factor());
  auto correction_dim = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // HF: prevent a singularity
  for (size_t i = 0; i < f.size(); ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    const float pos = static_cast<float>(std::pow(base, static_cast<double>(e)));  // base ** (2i / dim)
    const float extra = 1.0f / pos, inter = 1.0f / (factor * pos);
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
    const float ef = 1.0f - ramp;  // extrapolation factor
    f[i] = inter * (1.0f - ef) + extra * ef;
  }
}
// transformers' _compute_dynamic_ntk_parameters for seq_len > max_position_embeddings, in
// torch's order and dtypes: seq_len is an int64 tensor, so factor * seq_len / max_pos -
// (factor - 1) is float32, `** (dim / (dim - 2))` a float32 tensor to a Python float (std::pow
// in double, rounded), the base a float32 tensor, and base ** (arange(0, dim, 2) / dim) float32 to
// float32 (powf; torch's vectorised pow, used from 16 frequencies on, is within an ulp of it).
void dynamic_inv_freq(const LlamaConfig& c, int64_t length, std::vector<float>& f) {
  const double dim = static_cast<double>(c.head_dim);
  const float factor = static_cast<float>(c.rope_scaling.factor);
  const float ratio = factor * static_cast<float>(length) / static_cast<float>(c.max_position_embeddings) -
                      static_cast<float>(c.rope_scaling.factor - 1.0);
  const float grown = static_cast<float>(std::pow(static_cast<double>(ratio), dim / (dim - 2)));
  const float base = static_cast<float>(c.rope_theta) * grown;
  for (size_t i = 0; i < f.size(); ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    f[i] = 1.0f / std::pow(base, e);
  }
}
}  // namespace

std::vector<float> LlamaConfig::inv_freq(int64_t length) const {
  const int64_t half = head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  // dynamic: transformers recomputes from the base only past max_position_embeddings (below it,
  // and at init, the factor cancels exactly: base * 1 ** x, the default frequencies).
  if (rope_scaling.kind == RopeScalingKind::Dynamic && length > max_position_embeddings) {
    dynamic_inv_freq(*this, length, f);
    return f;
  }
  // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32.
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[static_cast<size_t>(i)] = 1.0f / static_cast<float>(std::pow(rope_theta, static_cast<double>(e)));
  }
  const float factor = static_cast<float>(rope_scaling.factor);
  if (rope_scaling.kind == RopeScalingKind::Yarn) {
    yarn_inv_freq(*this, f);
  } else if (rope_scaling.kind == RopeScalingKind::Linear) {
    for (float& x : f) x /= factor;
  } else if (rope_scaling.kind == RopeScalingKind::Llama3) {
    // transformers _compute_llama3_parameters, element by element, in fp32.
    const float old_ctx = static_cast<float>(rope_scaling.original_max_position_embeddings);
    const float lo = static_cast<float>(rope_scaling.low_freq_factor);
    const float hi = static_cast<float>(rope_scaling.high_freq_factor);
    const float low_freq_wavelen = old_ctx / lo;
    const float high_freq_wavelen = old_ctx / hi;
    for (float& x : f) {
      // PyTorch evaluates `scalar / tensor` as reciprocal(tensor) * scalar; so do we.
      const float wavelen = (1.0f / x) * static_cast<float>(2.0 * M_PI);
      float scaled = wavelen > low_freq_wavelen ? x / factor : x;
      const float smooth = ((1.0f / wavelen) * old_ctx - lo) / (hi - lo);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      x = medium ? smoothed : scaled;
    }
  }
  return f;
}

}  // namespace easyctx::model
