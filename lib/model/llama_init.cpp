// The random initialisation of a Llama model's parameters (model.init random): counter-based,
// so any chunk of any unit can be made on its own with the same values.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/llama.h"

namespace easyctx::model {

using ops::Tensor;

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Standard normal from a counter (Box-Muller on two hashed uniforms): portable and
// independent of thread count or iteration order.
double normal_at(uint64_t seed, uint64_t index) {
  const uint64_t a = splitmix64(seed ^ splitmix64(2 * index));
  const uint64_t c = splitmix64(seed ^ splitmix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double u2 = static_cast<double>(c >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}
// A uniform in [-1, 1) from a counter.
double uniform_at(uint64_t seed, uint64_t index) {
  return static_cast<double>(splitmix64(seed ^ splitmix64(index)) >> 11) / 4503599627370496.0 - 1.0;
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

// Elements [a, b) of unit u (a base tensor's or a trainable copy's: the values of the base
// unit's element they copy) into p[i - offset].
void random_values(const ParamTensor& t, int64_t a, int64_t b, int64_t offset, float* p, double std, uint64_t seed) {
  const uint64_t useed = splitmix64(seed * 1000003ull + static_cast<uint64_t>(t.base_unit));
  const int64_t shift = t.base_offset - t.offset;
#pragma omp parallel for schedule(static) if (b - a > (1 << 16))
  for (int64_t i = a; i < b; ++i)
    p[i - offset] = t.is_norm   ? 1.0f
                    : t.is_bias ? 0.0f
                                : static_cast<float>(std * normal_at(useed, static_cast<uint64_t>(i + shift)));
}

// PEFT's initialisation of an adapter's elements [a, b): A from torch's kaiming_uniform_(a =
// sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)) with in = A's columns; B zero. A pure function of
// (seed, the tensor's name, element).
void adapter_values(const ParamTensor& t, int64_t a, int64_t b, int64_t offset, float* p, uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape.back()));
  const uint64_t tseed = splitmix64(seed ^ name_hash(t.hf_name));
  for (int64_t i = a; i < b; ++i)
    p[i - offset] =
        t.lora_a ? static_cast<float>(bound * uniform_at(tseed, static_cast<uint64_t>(i - t.offset))) : 0.0f;
}

}  // namespace

namespace {
// fn(t, a, b) for each tensor t of unit `unit` with elements [a, b) among [offset, offset +
// dst.numel()), dst a host f32 view of those elements (`what` names the caller in errors).
template <class Fn>
void for_each_part(const ParamLayout& layout, size_t unit, int64_t offset, const Tensor& dst, const char* what,
                   Fn&& fn) {
  EASYCTX_CHECK(unit < layout.num_units(), what, ": unit ", unit, " of ", layout.num_units());
  const ParamUnit& pu = layout.units()[unit];
  const int64_t len = dst.numel();
  EASYCTX_CHECK(dst.dtype == DType::F32 && dst.space == MemSpace::Host && offset >= 0 && offset + len <= pu.numel, what,
                ": [", offset, ", ", offset + len, ") of unit ", pu.name, " (", pu.numel, ") into host f32, got ",
                dst.describe());
  for (const ParamTensor& t : pu.tensors) {
    const int64_t a = std::max(offset, t.offset), b = std::min(offset + len, t.offset + t.numel);
    if (a < b) fn(t, a, b);
  }
}
}  // namespace

void init_lora_range(const ParamLayout& layout, size_t unit, int64_t offset, const Tensor& dst, uint64_t seed) {
  for_each_part(layout, unit, offset, dst, "init_lora_range", [&](const ParamTensor& t, int64_t a, int64_t b) {
    if (t.adapter) adapter_values(t, a, b, offset, dst.ptr<float>(), seed);
  });
}

void init_random_range(const ParamLayout& layout, size_t unit, int64_t offset, const Tensor& dst, double std,
                       uint64_t seed) {
  for_each_part(layout, unit, offset, dst, "init_random_range", [&](const ParamTensor& t, int64_t a, int64_t b) {
    if (t.adapter) adapter_values(t, a, b, offset, dst.ptr<float>(), seed);
    else random_values(t, a, b, offset, dst.ptr<float>(), std, seed);
  });
}

void init_random(const ParamLayout& layout, const std::vector<Tensor>& units, double std, uint64_t seed) {
  EASYCTX_CHECK(units.size() == layout.num_units(), "init_random: unit count mismatch");
  for (size_t u = 0; u < units.size(); ++u) {
    const ParamUnit& pu = layout.units()[u];
    EASYCTX_CHECK(units[u].dtype == DType::F32 && units[u].space == MemSpace::Host && units[u].numel() == pu.numel,
                  "init_random: unit ", pu.name, " must be host f32[", pu.numel, "], got ", units[u].describe());
    init_random_range(layout, u, 0, units[u], std, seed);
  }
}

}  // namespace easyctx::model
