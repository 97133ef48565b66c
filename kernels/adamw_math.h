// The AdamW update of one fp32 element, shared by the CUDA kernel (kernels/adamw.cu) and the
// host optimizer of parallel.zero.offload_optimizer (lib/train/host_adamw.cpp), so the two
// give bit-identical weights: every operation is an explicitly rounded IEEE float operation
// (no fused multiply-add on either side: the device uses the __f*_rn intrinsics, which the
// compiler never contracts; the host file is compiled with -ffp-contract=off), and the step
// constants are computed once on the host in the same way for both.
//   m = b1 m + (1-b1) g;  v = b2 v + ((1-b2) g) g;  p = p (1 - lr wd) - lr (m/bc1) / (sqrt(v/bc2) + eps)
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define EASYCTX_HD __host__ __device__
#else
#define EASYCTX_HD
#endif

namespace easyctx::kernels {

struct AdamWConsts {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay, bc1, bc2;
};

// lr, betas, eps, weight decay and the 1-based step as the optimizer holds them (double).
inline AdamWConsts adamw_consts(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  AdamWConsts c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = static_cast<float>(eps);
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.bc1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
  c.bc2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  return c;
}

EASYCTX_HD inline void adamw_element(float& p, float g, float& m, float& v, const AdamWConsts& c) {
#if defined(__CUDA_ARCH__)
  const float mi = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  const float vi = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, c.bc2)), c.eps);
  const float step = __fdiv_rn(__fmul_rn(c.lr, __fdiv_rn(mi, c.bc1)), denom);
  p = __fsub_rn(__fmul_rn(p, c.decay), step);
#else
  const float mi = c.beta1 * m + c.one_minus_beta1 * g;
  const float vi = c.beta2 * v + (c.one_minus_beta2 * g) * g;
  const float denom = std::sqrt(vi / c.bc2) + c.eps;
  const float step = (c.lr * (mi / c.bc1)) / denom;
  p = p * c.decay - step;
#endif
  m = mi;
  v = vi;
}

}  // namespace easyctx::kernels

#undef EASYCTX_HD
