// LlamaModel's LoRA adapters (docs/training.md, "LoRA"): y = x W^T + scale (x A^T) B^T on the
// targeted projections, as PEFT's Linear computes it (lora_B(lora_A(x)) * scaling), the base W
// frozen. The adapters' matmuls go through the backend's matmul like every other projection;
// their inputs t = x A^T ([rows, r], tiny beside the activations) are kept with the layer's
// activations for the backward, recomputed with them where the layer is.
#include "core/error.h"
#include "model/llama.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Tensor;

void LlamaModel::lora_forward(const Tensor& x, const LayerParams& p, int target, const Tensor& t, const Tensor& y) {
  const size_t k = static_cast<size_t>(target);
  be_.matmul(x, false, p.a[k], true, t);
  be_.matmul(t, false, p.b[k], true, y, p.scale, 1.0);
}

// y = x W^T + s t B^T, t = x A^T: dB += s dy^T t; u = s dy B; dA += u^T x; dx += u A.
void LlamaModel::lora_backward(const Tensor& x, const Tensor& dy, const LayerParams& p, int target, const Tensor& t,
                               const Tensor& u, const Tensor& dx) {
  const size_t k = static_cast<size_t>(target);
  be_.matmul(dy, true, t, false, p.gb[k], p.scale, 1.0);
  be_.matmul(dy, false, p.b[k], false, u, p.scale, 0.0);
  be_.matmul(u, true, x, false, p.ga[k], 1.0, 1.0);
  be_.matmul(u, false, p.a[k], false, dx, 1.0, 1.0);
}

void LlamaModel::lora_qkv_inputs(const Tensor& h1, const LayerParams& p, LayerActs& a) {
  const int64_t n = h1.dim(0);
  for (int t = kLoraQ; t <= kLoraV; ++t)
    if (p.lora(t))
      be_.matmul(h1, false, p.a[static_cast<size_t>(t)], true, a.lora_t[static_cast<size_t>(t)].view({n, p.rank}));
}

// Group g's columns of A_o [r, Hq hd] (the rows of o it reads), packed [r, Hq/G hd].
Tensor LlamaModel::lora_o_columns(const LayerParams& p, Workspace& ws, int64_t g, int64_t groups) {
  const int64_t r = p.rank, qd = cfg_.q_dim() / groups;
  const Tensor ao = ws.lora_ao.view({r, qd}), all = p.a[kLoraO].reshape({r * groups * qd});
  be_.copy_2d(ao, qd, all.slice_flat(g * qd, {all.numel() - g * qd}), groups * qd, r, qd);
  return ao;
}

// dA_o's group-g columns += u^T o_g (through the packed scratch: its own columns only, so each
// element gets the one product the untiled gradient adds).
void LlamaModel::lora_o_grad_columns(const LayerParams& p, Workspace& ws, int64_t g, int64_t groups, const Tensor& u,
                                     const Tensor& o) {
  const int64_t r = p.rank, qd = cfg_.q_dim() / groups;
  const Tensor dao = ws.lora_dao.view({r, qd}), all = p.ga[kLoraO].reshape({r * groups * qd});
  const Tensor part = all.slice_flat(g * qd, {all.numel() - g * qd});
  be_.copy_2d(dao, qd, part, groups * qd, r, qd);
  be_.matmul(u, true, o, false, dao, 1.0, 1.0);
  be_.copy_2d(part, groups * qd, dao, qd, r, qd);
}

void LlamaModel::check_grads(const std::vector<Tensor>& grads) const {
  EASYCTX_CHECK(grads.size() == layout_.num_units(), "LlamaModel: ", layout_.num_units(),
                " gradient units expected, got ", grads.size());
  for (size_t u = 0; u < grads.size(); ++u)
    if (!frozen(u)) checked(grads[u], u, grad_dtype_, "gradient");
}

}  // namespace easyctx::model
