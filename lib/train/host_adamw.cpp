#include "train/host_adamw.h"

#include <cuda_runtime.h>

#include <chrono>

#include "adamw_math.h"
#include "core/error.h"
#include "cuda_check.h"
#include "ops/half.h"

namespace easyctx::train {

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = ops::float_to_bf16(src[i]);
}

struct HostAdamW::Impl {
  int64_t chunk = 0;
  float* grad[2] = {nullptr, nullptr};     // pinned f32[chunk]
  uint16_t* work[2] = {nullptr, nullptr};  // pinned bf16[chunk]
  cudaStream_t down = nullptr, up = nullptr;
  cudaEvent_t got[2] = {nullptr, nullptr}, sent[2] = {nullptr, nullptr};
  ~Impl() {
    for (int s = 0; s < 2; ++s) {
      if (got[s]) cudaEventDestroy(got[s]);
      if (sent[s]) cudaEventDestroy(sent[s]);
      if (grad[s]) cudaFreeHost(grad[s]);
      if (work[s]) cudaFreeHost(work[s]);
    }
    if (down) cudaStreamDestroy(down);
    if (up) cudaStreamDestroy(up);
  }
};

HostAdamW::HostAdamW(int64_t chunk_elems) : impl_(std::make_unique<Impl>()) {
  EASYCTX_CHECK(chunk_elems > 0, "HostAdamW: chunk of ", chunk_elems, " elements");
  Impl& I = *impl_;
  I.chunk = chunk_elems;
  for (int s = 0; s < 2; ++s) {
    EASYCTX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&I.grad[s]), static_cast<size_t>(chunk_elems) * 4));
    EASYCTX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&I.work[s]), static_cast<size_t>(chunk_elems) * 2));
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&I.got[s], cudaEventDisableTiming));
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&I.sent[s], cudaEventDisableTiming));
  }
  EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&I.down, cudaStreamNonBlocking));
  EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&I.up, cudaStreamNonBlocking));
}

HostAdamW::~HostAdamW() = default;

int64_t HostAdamW::pinned_bytes() const { return 2 * impl_->chunk * 6; }

void HostAdamW::step(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& I = *impl_;
  struct Chunk {
    const OffloadPiece* p;
    int64_t off, n;
  };
  std::vector<Chunk> chunks;
  for (const OffloadPiece& p : pieces)
    for (int64_t off = 0; off < p.n; off += I.chunk) chunks.push_back({&p, off, std::min(I.chunk, p.n - off)});
  auto fetch = [&](size_t i) {  // gradient chunk i -> slot i % 2
    const Chunk& c = chunks[i];
    const int sl = static_cast<int>(i % 2);
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(I.grad[sl], c.p->grad_dev + c.off, static_cast<size_t>(c.n) * 4,
                                     cudaMemcpyDeviceToHost, I.down));
    EASYCTX_CUDA_CHECK(cudaEventRecord(I.got[sl], I.down));
  };
  bool sent_pending[2] = {false, false};
  if (!chunks.empty()) fetch(0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const int sl = static_cast<int>(i % 2);
    EASYCTX_CUDA_CHECK(cudaEventSynchronize(I.got[sl]));
    if (i + 1 < chunks.size()) fetch(i + 1);  // the other slot's gradient buffer was consumed at i - 1
    const kernels::AdamWConsts k = kernels::adamw_consts(s.lr, s.beta1, s.beta2, s.eps, c.p->weight_decay, s.step);
    float *p = c.p->master + c.off, *m = c.p->m + c.off, *v = c.p->v + c.off;
    const float* g = I.grad[sl];
    uint16_t* out = I.work[sl];
    if (sent_pending[sl]) EASYCTX_CUDA_CHECK(cudaEventSynchronize(I.sent[sl]));  // chunk i - 2 left this slot
    // One pass: the update and the bf16 copy of the new weight (one read of the master less).
#pragma omp parallel for schedule(static) if (c.n > (1 << 16))
    for (int64_t j = 0; j < c.n; ++j) {
      kernels::adamw_element(p[j], g[j], m[j], v[j], k);
      out[j] = ops::float_to_bf16(p[j]);
    }
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint16_t*>(c.p->work_dev) + c.off, I.work[sl],
                                     static_cast<size_t>(c.n) * 2, cudaMemcpyHostToDevice, I.up));
    EASYCTX_CUDA_CHECK(cudaEventRecord(I.sent[sl], I.up));
    sent_pending[sl] = true;
  }
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.up));
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.down));
  last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace easyctx::train
