// The Llama decoder (LlamaForCausalLM) forward and backward through ops::Backend.
//
// Parameters come in as one view per ParamLayout unit (flat, in the compute dtype: f32 for
// CPU training, bf16 on CUDA, f64 for the golden/gradient tests); gradients likewise (or f32
// with ModelOptions::f32_grads), accumulated (+=), so
// gradient accumulation is just several calls before the optimizer step. Tokens, positions
// and labels are i32 views [batch * seq] of this rank's slice; positions drive RoPE only.
//
// Activation policy: CheckpointPolicy::None keeps every layer's activations from forward to
// backward; Layer keeps only each layer's input (the residual stream) and recomputes the
// layer in backward; AttentionOutput (LightSeq's rematerialization-aware cut) also keeps
// each layer's attention output and LSE, so the recompute redoes the cheap projections,
// norms and MLP but never the attention (the O(S^2) part, and the ring communication).
// All three give bit-identical results. ModelOptions::mlp_tile runs the MLP a tile of rows
// at a time (recomputed per tile in backward under Layer/AttentionOutput), which changes only
// the summation order of the MLP weight gradients. ModelOptions::offload_checkpoints keeps the
// checkpoints of Layer/AttentionOutput in pinned host memory (activation.offload: cpu): the
// device holds a ring of two of each, copied out while the next layer computes and brought
// back one layer ahead of the backward (Backend::copy_async), bit-identical again. Where the
// checkpoints live is the ActivationStore's business (model/activation_store.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "core/config.h"
#include "model/llama_config.h"
#include "model/param_layout.h"
#include "ops/ops.h"

namespace easyctx::model {

using ops::DType;
using ops::MemSpace;

struct Batch {
  ops::Tensor tokens;     // i32[batch * seq]
  ops::Tensor positions;  // i32[batch * seq]
  ops::Tensor labels;     // i32[batch * seq], -1 = not scored
  int64_t batch = 0;
  int64_t seq = 0;
  // data.document_mask: per sequence, where its packed documents start (attention.h's
  // DocumentStarts, [batch] entries); nullptr: every sequence is one causal document.
  const std::vector<attention::DocumentStarts>* documents = nullptr;
  // Dynamic RoPE (rope_scaling dynamic): the length transformers would compute the frequencies
  // for, its seq_len = the largest position id + 1 over the whole batch (every sequence-parallel
  // rank's tokens, the layout's padding left out): the trainer and the evaluations give it. 0:
  // this rank's largest position + 1 (one rank without padding: the same).
  int64_t rope_length = 0;
  int64_t tokens_count() const { return batch * seq; }
  // The attention's view of `documents` (checked against batch).
  const attention::DocumentStarts* docs() const;
};

// One buffer of the model's workspace (LlamaModel::workspace_specs): the memory plan's
// view of exactly what forward_backward allocates, described where it is allocated.
struct BufferSpec {
  std::string name;  // unique in the workspace; indices name the copies ("acts.3.q", "resid.0")
  DType dtype;
  int64_t numel;
  bool pinned_host = false;  // Backend::alloc_host_pinned (offloaded checkpoints), else alloc
  std::string shape;         // symbolic: n tokens, D hidden, Hq/Hkv heads of hd, I intermediate, ...
  std::string label;         // what it holds (the plan's table)
};

// Where forward_backward finds each unit's parameters and gradients (ZeRO-3 gathers a layer
// unit just before it is used and reduce-scatters its gradient right after its backward).
// The model calls, per unit: acquire -> use -> release, and grad -> accumulate (+=) ->
// grad_done; a layer unit is released before the next layer is acquired, and acquired once
// for its recompute + backward. begin() announces the order of every acquire of one call
// (prefetch hint). Views stay valid until the matching release / grad_done.
struct ParamSource {
  virtual ~ParamSource() = default;
  virtual void begin(const std::vector<size_t>& order) { (void)order; }
  virtual ops::Tensor acquire(size_t unit) = 0;  // the unit's parameters (model dtype, flat)
  virtual void release(size_t unit) = 0;
  virtual ops::Tensor grad(size_t unit) = 0;  // the unit's gradient (grad dtype, flat), accumulated into
  virtual void grad_done(size_t unit) = 0;
};

// The default source: every unit resident in caller-owned vectors (acquire/release are views).
class VectorParamSource : public ParamSource {
 public:
  VectorParamSource(const std::vector<ops::Tensor>& params, const std::vector<ops::Tensor>& grads)
      : params_(params), grads_(grads) {}
  ops::Tensor acquire(size_t unit) override { return params_.at(unit); }
  void release(size_t) override {}
  ops::Tensor grad(size_t unit) override { return grads_.at(unit); }
  void grad_done(size_t) override {}

 private:
  const std::vector<ops::Tensor>& params_;
  const std::vector<ops::Tensor>& grads_;
};

struct ModelOptions {
  CheckpointPolicy checkpoint = CheckpointPolicy::Layer;
  int64_t lm_head_tile = 4096;  // tokens per LM-head/cross-entropy tile
  // Tokens per MLP tile along the sequence (0: one tile). With a recomputing checkpoint
  // policy the [tokens, intermediate] MLP buffers shrink to [mlp_tile, intermediate].
  int64_t mlp_tile = 0;
  // Gradients in f32 whatever the parameter dtype (bf16 training: fp32 gradient
  // accumulation). Ops that need matching dtypes (the embedding backward) go through a
  // parameter-dtype scratch that is then added into the f32 gradient.
  bool f32_grads = false;
  // The checkpoints of a recomputing policy (layer inputs; with AttentionOutput also the
  // attention outputs and LSE) in pinned host memory, except those of the last layers that
  // the backward starts with; needs checkpoint Layer or AttentionOutput.
  bool offload_checkpoints = false;
  // With offload_checkpoints: how many layer inputs leave, from layer 0 on (0 or more than
  // L - 1: all, L - 1); the rest stay on the device. The attention outputs of the first
  // offload_layers - 1 layers leave with them.
  int64_t offload_layers = 0;
  // checkpoint AttentionOutput: how many layers keep their attention output and LSE, the
  // last ones (0 or more than L: every layer); the others recompute their attention as with
  // Layer. Offloaded, the kept outputs of layers below offload_layers - 1 leave too.
  int64_t attention_output_layers = 0;
  // activation.attention_head_groups: G > 1 tiles the attention block over G groups of
  // Hq/G query and Hkv/G key/value heads (contiguous rows of W_Q, W_K, W_V, columns of W_O):
  // per group the Q/K/V projections, RoPE, the attention (the strategy's inner one, on the
  // group's heads) and the output projection's partial sum, forward and backward, so q, k, v,
  // o and their gradients exist for one group at a time (checkpoint none keeps every group's).
  // forward_score keeps its full-head buffers (and a HeadGroupedAttention strategy).
  int64_t head_groups = 1;
  // attention_output checkpoints offloaded with head groups stream to host memory group by
  // group (two group-sized device slots; every kept layer's in host memory: docs/memory-model.md).
  // Lets a sliding window run on a device backend, which the model refuses otherwise until the
  // GPU checks of the CUDA windows have passed on a device (docs/model.md, "Sliding window"):
  // set by those tests only (tests/gpu), never from a config.
  bool unchecked_device_window = false;
  bool streams_attention_output() const {
    return checkpoint == CheckpointPolicy::AttentionOutput && offload_checkpoints && head_groups > 1;
  }
  // lora.rank > 0: the LoRA layout (ParamLayout(config, lora)): the base frozen (no weight
  // gradient is computed for it), adapters y += scale (x A^T) B^T on the targeted projections,
  // the trainable copies read where the model reads those tensors (docs/training.md, "LoRA").
  LoraSpec lora = {};
};

// The ModelOptions of a training stage (activation.* keys); `device`: bf16 parameters with
// fp32 gradients (train.device cuda). The trainer, the memory plan and the evaluations use it.
ModelOptions options_for(const StageConfig& cfg, bool device);

class ActivationStore;
struct SavedAttention;
struct WorkspaceDims;
struct LayerParams;

class LlamaModel {
 public:
  // `attn` may be null: local (single-rank) causal attention.
  LlamaModel(const LlamaConfig& cfg, ops::Backend& be, DType dtype, ModelOptions opts = {},
             std::shared_ptr<attention::SequenceAttention> attn = nullptr);
  ~LlamaModel();

  const LlamaConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  DType grad_dtype() const { return grad_dtype_; }

  // Every buffer forward_backward (backward) or the forward-only paths allocate for a batch
  // of batch x seq tokens, from the code that allocates them (plus the embedding-gradient
  // scratch of f32 gradients with bf16 parameters). The memory plan sums these.
  static std::vector<BufferSpec> workspace_specs(const LlamaConfig& cfg, const ModelOptions& opts, DType dtype,
                                                 int64_t batch, int64_t seq, bool backward);

  // Views of one tensor inside a unit view (the unit's dtype).
  ops::Tensor tensor_view(const ops::Tensor& unit, size_t unit_index, size_t tensor_index) const;
  // A layer tensor by name (its index from ParamLayout::layer_slot).
  ops::Tensor tensor_view(const ops::Tensor& unit, size_t unit_index, LayerTensor t) const {
    return tensor_view(unit, unit_index, layout_.layer_slot(t));
  }

  // Forward + backward of grad_scale * sum(NLL over labelled tokens); grads accumulate.
  // Returns the NLL sum and label count of this batch.
  ops::LossSums forward_backward(const std::vector<ops::Tensor>& params, const std::vector<ops::Tensor>& grads,
                                 const Batch& b, double grad_scale);
  // The same with parameters and gradients from a ParamSource (the same ops in the same
  // order: the vector form is this with a VectorParamSource). Layer units are acquired in
  // the order 0..L-1 (forward), then L-1..0 (recompute + backward).
  ops::LossSums forward_backward(ParamSource& src, const Batch& b, double grad_scale);
  // The order in which forward_backward acquires the units (what begin() receives).
  std::vector<size_t> acquire_order() const;
  // Forward only: NLL sum and count (evaluation).
  ops::LossSums forward_loss(const std::vector<ops::Tensor>& params, const Batch& b);
  // Forward only, in two parts for evaluations that score prefixes of one pass: the final
  // normed hidden states [batch * seq, D] (a view valid until the next call), then the
  // LM-head loss of any rows of them (hidden rows and their labels).
  ops::Tensor forward_hidden(const std::vector<ops::Tensor>& params, const Batch& b);
  ops::LossSums head_loss(const std::vector<ops::Tensor>& params, const ops::Tensor& hidden, const ops::Tensor& labels);
  // Forward only: logits [batch * seq, vocab] (tests and small evaluations).
  void forward_logits(const std::vector<ops::Tensor>& params, const Batch& b, const ops::Tensor& logits);

  // Forward only, the evaluations' path (lib/eval/session.h): no gradients, no checkpoints,
  // a workspace of its own (score_workspace_specs): the residual stream updated in place and
  // one layer's activations, reused by every layer, grown to the most tokens seen and kept
  // until release_workspace(); the MLP in tiles of mlp_tile rows; attention through the
  // model's strategy; the LM head only on the rows with a label (>= 0), a run of consecutive
  // labelled rows at a time in tiles of lm_head_tile rows (Backend::lm_head_score), so no
  // logits exist for the other rows. nll f64[n] and top i32[n] (host memory) receive each
  // labelled row's NLL and whether its label is the argmax; 0 and 0 elsewhere. On the CPU
  // the NLLs are bit for bit those forward_loss sums: the same ops on the same values (the
  // residual additions in the other operand order, which IEEE addition does not see).
  void forward_score(const std::vector<ops::Tensor>& params, const Batch& b, const ops::Tensor& nll,
                     const ops::Tensor& top);
  // What forward_score allocates for batch x seq tokens (the memory plan's view).
  static std::vector<BufferSpec> score_workspace_specs(const LlamaConfig& cfg, const ModelOptions& opts, DType dtype,
                                                       int64_t batch, int64_t seq);
  // Frees every workspace (forward_score's and the others'); the next call allocates afresh.
  void release_workspace();

 private:
  struct LayerActs;
  struct Workspace;
  struct ScoreWorkspace;
  template <class Visit>
  static void visit_score_workspace(const LlamaConfig& c, const ModelOptions& o, DType dt, int64_t tokens,
                                    ScoreWorkspace* ws, Visit&& visit);
  void score_layer(const LayerParams& p, const Batch& b, ScoreWorkspace& ws);
  // Layer l's tensors on the units acquired: w (its base unit) and wl (its lora.layer unit, or
  // empty), their gradients gw and gwl (empty: frozen, or forward only).
  LayerParams layer_params(int64_t l, const ops::Tensor& w, const ops::Tensor& wl, const ops::Tensor& gw,
                           const ops::Tensor& gwl) const;
  // The tensor at `loc` of the units acquired (indexed by unit; empty where not acquired).
  ops::Tensor view_at(const std::vector<ops::Tensor>& units, const ParamLayout::Loc& loc) const;
  bool frozen(size_t unit) const { return layout_.units()[unit].frozen; }
  // y += scale (x A^T) B^T, t = x A^T [rows, r] kept for the backward.
  void lora_forward(const ops::Tensor& x, const LayerParams& p, int target, const ops::Tensor& t, const ops::Tensor& y);
  // Its backward given dy: u = scale dy B (scratch [rows, r]); dx += u A; gA += u^T x; gB += scale dy^T t.
  void lora_backward(const ops::Tensor& x, const ops::Tensor& dy, const LayerParams& p, int target,
                     const ops::Tensor& t, const ops::Tensor& u, const ops::Tensor& dx);
  // A layer's adapter input of `target` (x A^T), `rows` rows.
  static ops::Tensor lora_in(LayerActs& a, int target, int64_t rows, int64_t rank);
  // The adapters' inputs of q, k and v (t = h1 A^T) into the layer's activations.
  void lora_qkv_inputs(const ops::Tensor& h1, const LayerParams& p, LayerActs& a);
  void check_params(const std::vector<ops::Tensor>& params, const char* what) const;
  void check_params(const std::vector<ops::Tensor>& params, const char* what, DType want) const;
  // Every trainable unit's gradient (a frozen unit's entry is not read).
  void check_grads(const std::vector<ops::Tensor>& grads) const;
  std::vector<size_t> head_units() const;
  Workspace& workspace(const Batch& b, bool for_backward);
  static void visit_workspace(const WorkspaceDims& dims, Workspace* ws,
                              const std::function<void(const BufferSpec&, ops::Buffer*)>& visit);
  static void visit_lora_acts(const WorkspaceDims& dims, const std::string& prefix, int64_t mlp_rows, LayerActs* a,
                              const std::function<void(const BufferSpec&, ops::Buffer*)>& visit);
  static void visit_lora_workspace(const WorkspaceDims& dims, Workspace* ws,
                                   const std::function<void(const BufferSpec&, ops::Buffer*)>& visit);
  static int64_t mlp_rows(const ModelOptions& o, int64_t n, bool keep_all);
  void forward_trunk(ParamSource& src, const Batch& b, Workspace& ws, bool keep);
  // The LM head and the final norm, forward (the loss) and backward (ws.dx: the gradient of the
  // last hidden states; embed_grad: the embedding's gradient unit, which a tied head adds to);
  // then the embedding's backward from ws.dx into embed_grad.
  ops::LossSums head_backward(ParamSource& src, const Batch& b, Workspace& ws, double grad_scale,
                              ops::Tensor& embed_grad);
  void embedding_backward(ParamSource& src, const Batch& b, Workspace& ws, const ops::Tensor& embed_grad);
  ops::Tensor checked(const ops::Tensor& t, size_t unit, DType want, const char* what) const;
  // The softmax scale: 1/sqrt(head_dim), times the square of yarn's attention factor (HF
  // scales cos and sin, so q and k, by it).
  double attention_scale() const;
  // The attention's input projections (llama_qkv.cpp): q, k, v from the input norm's output,
  // qwen2's biases, qwen3's per-head q/k norms, RoPE; and their backward down to the
  // projections' outputs. One head group's views (or every head's).
  struct QkvWeights;
  struct QkvActs;
  // grads: the gradients' views (LayerParams::g, its adapters' gB) instead of the parameters'.
  QkvWeights qkv_weights(const LayerParams& p, LayerActs* a, int64_t n, int64_t g, int64_t groups,
                         bool grads = false) const;
  // Group g of G's views into a layer's activations (group-major when they hold every group).
  QkvActs qkv_acts(LayerActs& a, int64_t n, int64_t g, int64_t groups) const;
  void project_qkv(const ops::Tensor& h1, const QkvWeights& w, const QkvActs& a, const ops::Buffer& ones,
                   const Batch& b);
  // dq, dk: gradients of the roped q and k on entry, of the projections' outputs on return;
  // the bias and norm gradients accumulate into gw (scratch: [n, Hq hd] of the group, free).
  void qkv_backward(const QkvWeights& w, const QkvWeights& gw, const QkvActs& a, const ops::Tensor& dq,
                    const ops::Tensor& dk, const ops::Tensor& dv, const ops::Tensor& scratch, const ops::Buffer& ones,
                    const Batch& b);
  // qwen2's q/k/v biases, through matmul with a column of ones (no op of their own):
  // y[n, m] += 1 bias (forward); gbias[m] += 1^T dy (backward).
  void add_bias(const ops::Buffer& ones, const ops::Tensor& bias, const ops::Tensor& y);
  void bias_grad(const ops::Buffer& ones, const ops::Tensor& dy, const ops::Tensor& gbias);
  ops::Tensor mlp_norm_tile(const ops::Tensor& norm, LayerActs& a, const ops::Tensor& x_mid, int64_t r0, int64_t rows);
  // The MLP of rows [r0, r0 + rows): g, u (with their adapters), m; out (not empty): the down
  // projection (with its adapter) into it. t_down: the down adapter's input is computed also
  // without out (the backward's recompute needs it).
  void mlp_tile_forward(const LayerParams& p, LayerActs& a, const ops::Tensor& h2t, int64_t rows,
                        const ops::Tensor& out);
  void mlp_tile_backward(const LayerParams& p, LayerActs& a, Workspace& ws, const ops::Tensor& h2t,
                         const ops::Tensor& dxt, const ops::Tensor& dht, int64_t rows);
  // One layer from x_in; x_out empty (the backward's recompute) stops before the MLP. saved:
  // the layer's attention output (ActivationStore::output_target in the forward,
  // attention_output in the recompute).
  void layer_forward(const LayerParams& p, const ops::Tensor& x_in, const ops::Tensor& x_out, const Batch& b,
                     LayerActs& a, Workspace& ws, const SavedAttention& saved);
  void layer_backward(const LayerParams& p, const ops::Tensor& x_in, const Batch& b, LayerActs& a, Workspace& ws,
                      const ops::Tensor& dx, const SavedAttention& saved);
  // The attention block of the untiled layer (head_groups 1), backward: dx the gradient of
  // x_mid; dh receives the input norm's output gradient.
  void attention_backward(const LayerParams& p, const Batch& b, LayerActs& a, Workspace& ws, const ops::Tensor& dx);
  // The attention block tiled over head groups (head_groups > 1): x_mid = sum_g o_g W_O,g^T,
  // and its backward (dh = the input norm's output gradient, weight gradients accumulated).
  void attention_forward_grouped(const LayerParams& p, const ops::Tensor& h1, const Batch& b, LayerActs& a,
                                 Workspace& ws, const ops::Tensor& x_mid, const SavedAttention& saved);
  void attention_backward_grouped(const LayerParams& p, const Batch& b, LayerActs& a, Workspace& ws,
                                  const ops::Tensor& dx, const SavedAttention& saved);
  void lora_grouped_begin(const LayerParams& p, LayerActs& a, Workspace& ws, const ops::Tensor& dx);
  void lora_grouped_qkv(const LayerParams& p, const QkvWeights& w, const QkvWeights& gw, int64_t g,
                        const ops::Tensor& dq, const ops::Tensor& dk, const ops::Tensor& dv, Workspace& ws);
  void lora_grouped_end(const LayerParams& p, LayerActs& a, Workspace& ws, int64_t n);
  // The o_proj adapter's part of the tiled attention block: group g's columns of A_o packed
  // into ws.lora_ao (and of its gradient, into ws.lora_dao and back).
  ops::Tensor lora_o_columns(const LayerParams& p, Workspace& ws, int64_t g, int64_t groups);
  void lora_o_grad_columns(const LayerParams& p, Workspace& ws, int64_t g, int64_t groups, const ops::Tensor& u,
                           const ops::Tensor& o);
  ops::Tensor head_matrix(const std::vector<ops::Tensor>& units) const;

  LlamaConfig cfg_;
  ParamLayout layout_;
  ops::Backend& be_;
  DType dtype_;
  DType grad_dtype_;
  ModelOptions opts_;
  std::shared_ptr<attention::SequenceAttention> attn_;
  // What the tiled attention block calls per head group: attn_'s inner strategy when attn_
  // is a HeadGroupedAttention (the trainer's), else attn_ itself.
  std::shared_ptr<attention::SequenceAttention> group_attn_;
  ops::Buffer inv_freq_;  // f32[head_dim / 2]
  // Dynamic RoPE: the length inv_freq_ was computed for (max_position_embeddings or more).
  int64_t rope_length_ = 0;
  // Dynamic RoPE: inv_freq_ for the batch's length (Batch::rope_length), recomputed and
  // uploaded when it changes; other scalings keep their one table.
  void prepare_rope(const Batch& b);
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<ActivationStore> store_;  // the checkpoints of ws_'s batch
  std::unique_ptr<ScoreWorkspace> score_ws_;
  ops::Buffer embed_grad_scratch_, embed_grad_f32_;  // [V, D] (f32_grads with a non-f32 dtype)
};

// Random initialisation like HF (normal(0, std) for matrices and embeddings, 1 for norm
// gains) into fp32 unit buffers; a pure function of (seed, unit, element).
void init_random(const ParamLayout& layout, const std::vector<ops::Tensor>& units_f32, double std, uint64_t seed);
// Elements [offset, offset + dst.numel()) of unit `unit` of the same initialisation, into host
// f32 `dst` (so a model can be made a chunk at a time: the same values as init_random).
void init_random_range(const ParamLayout& layout, size_t unit, int64_t offset, const ops::Tensor& dst, double std,
                       uint64_t seed);
// LoRA adapters (ParamTensor::adapter) start as PEFT's do: A from torch's kaiming_uniform_(a =
// sqrt(5)), U(-1/sqrt(in), 1/sqrt(in)), B zero; a pure function of (seed, the tensor's name,
// element). Writes the adapters' elements among [offset, offset + dst.numel()) of unit `unit`
// into host f32 `dst`, leaving the others; init_random_range initialises adapters the same way.
void init_lora_range(const ParamLayout& layout, size_t unit, int64_t offset, const ops::Tensor& dst, uint64_t seed);

}  // namespace easyctx::model
