// TEMPORARY copy of LlamaModel::workspace_specs; see workspace_specs.h.
#include "plan/workspace_specs.h"

namespace easyctx::plan {

std::vector<BufferSpec> workspace_specs(const model::LlamaConfig& cfg, const model::ModelOptions& opts,
                                        ops::DType dtype, int64_t batch, int64_t seq, bool backward,
                                        int64_t mlp_tile) {
  using ops::DType;
  std::vector<BufferSpec> out;
  auto add = [&](std::string name, DType t, int64_t numel) { out.push_back({std::move(name), t, numel}); };
  const bool keep_all = backward && opts.checkpoint == CheckpointPolicy::None;
  const int64_t n = batch * seq, d = cfg.hidden_size, ff = cfg.intermediate_size;
  const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim();
  const DType st = dtype == DType::F64 ? DType::F64 : DType::F32;
  const int64_t rows_ff = (!keep_all && mlp_tile > 0 && mlp_tile < n) ? mlp_tile : n;  // MLP tile rows
  for (int64_t l = 0; l <= (backward ? cfg.num_layers : 1); ++l) add("resid." + std::to_string(l), dtype, n * d);
  const int64_t sets = keep_all ? cfg.num_layers : 1;
  for (int64_t l = 0; l < sets; ++l) {
    const std::string p = "acts." + std::to_string(l) + ".";
    add(p + "h1", dtype, n * d);
    add(p + "rstd1", st, n);
    add(p + "q", dtype, n * qd);
    add(p + "k", dtype, n * kvd);
    add(p + "v", dtype, n * kvd);
    add(p + "o", dtype, n * qd);
    add(p + "lse", st, batch * cfg.num_heads * seq);
    add(p + "x_mid", dtype, n * d);
    add(p + "h2", dtype, n * d);
    add(p + "rstd2", st, n);
    add(p + "g", dtype, rows_ff * ff);
    add(p + "u", dtype, rows_ff * ff);
    add(p + "m", dtype, rows_ff * ff);
  }
  if (backward && opts.checkpoint == CheckpointPolicy::AttentionOutput)
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      add("saved_o." + std::to_string(l), dtype, n * qd);
      add("saved_lse." + std::to_string(l), st, batch * cfg.num_heads * seq);
    }
  add("hf", dtype, n * d);
  add("rstd_f", st, n);
  add("tmp", dtype, n * d);
  if (backward) {
    add("dx", dtype, n * d);
    add("dh", dtype, n * d);
    add("dm", dtype, rows_ff * ff);
    add("dg", dtype, rows_ff * ff);
    add("du", dtype, rows_ff * ff);
    add("dattn", dtype, n * qd);
    add("dq", dtype, n * qd);
    add("dk", dtype, n * kvd);
    add("dv", dtype, n * kvd);
    // The embedding backward needs dtable in the activation dtype (allocated after the first
    // backward, kept).
    if (opts.f32_grads && dtype != DType::F32) {
      add("embed_grad_scratch", dtype, cfg.vocab_size * d);
      add("embed_grad_f32", DType::F32, cfg.vocab_size * d);
    }
  }
  return out;
}

}  // namespace easyctx::plan
