// The stage-config keys of the train section (the optimizer and its schedule, the device and
// how the step runs) and of lora (config_schema.cpp's registry() adds them).
#include "core/config_schema_keys.h"

namespace easyctx::config_schema {

using config_registry::KeyRole;
using config_registry::Registry;

// ---- train
void add_train_keys(Registry& r) {
  r.role = KeyRole::kTraining;
  r.add_int(
      "train.steps", [](StageConfig& c) -> int64_t& { return c.train.steps; }, 0, kMaxI,
      "Optimizer steps in this stage.");
  r.add_uint(
      "train.seed", [](StageConfig& c) -> uint64_t& { return c.train.seed; },
      "Seed of initialisation and data order; sample i of the run is a pure function of (seed, i).");
  r.role = KeyRole::kGlobalBatch;
  r.add_int(
      "train.batch_size", [](StageConfig& c) -> int64_t& { return c.train.batch_size; }, 1, kMaxI,
      "Sequences per data-parallel rank per micro-step. Global batch = batch_size x grad_accum x "
      "data-parallel size sequences.");
  r.add_int(
      "train.grad_accum", [](StageConfig& c) -> int64_t& { return c.train.grad_accum; }, 1, kMaxI,
      "Micro-steps accumulated per optimizer step.");
  r.role = KeyRole::kTraining;
  r.add_float(
      "train.lr", [](StageConfig& c) -> double& { return c.train.lr; }, 0, true, 1, false,
      "Peak learning rate (AdamW).");
  r.add_float(
      "train.min_lr", [](StageConfig& c) -> double& { return c.train.min_lr; }, 0, false, 1, false,
      "Final learning rate of the linear and cosine schedules.");
  r.add_enum<LrSchedule>(
      "train.schedule", [](StageConfig& c) -> LrSchedule& { return c.train.schedule; },
      {{"constant", 0}, {"linear", 1}, {"cosine", 2}},
      "Learning-rate schedule after warmup: constant at lr, or linear/cosine decay from lr to "
      "min_lr at the last step.");
  r.add_int(
      "train.warmup_steps", [](StageConfig& c) -> int64_t& { return c.train.warmup_steps; }, 0, kMaxI,
      "Linear warmup from 0 to lr over this many steps.");
  r.add_float(
      "train.beta1", [](StageConfig& c) -> double& { return c.train.beta1; }, 0, false, 1, true, "AdamW beta1.");
  r.add_float(
      "train.beta2", [](StageConfig& c) -> double& { return c.train.beta2; }, 0, false, 1, true, "AdamW beta2.");
  r.add_float(
      "train.eps", [](StageConfig& c) -> double& { return c.train.eps; }, 0, true, kMaxF, false, "AdamW epsilon.");
  r.add_float(
      "train.weight_decay", [](StageConfig& c) -> double& { return c.train.weight_decay; }, 0, false, 1, false,
      "Decoupled weight decay (applied to matrices, not to norms).");
  r.add_float(
      "train.grad_clip", [](StageConfig& c) -> double& { return c.train.grad_clip; }, 0, false, kMaxF, false,
      "Clip the global gradient norm to this value; 0 disables clipping.");
  r.add_enum<NonFinitePolicy>(
      "train.on_nonfinite", [](StageConfig& c) -> NonFinitePolicy& { return c.train.on_nonfinite; },
      {{"stop", 0}, {"skip_step", 1}},
      "A step whose loss or global gradient norm is NaN or infinite: `stop` ends the run "
      "with an error naming the step, before the update (nothing with those gradients is "
      "applied or checkpointed; the last checkpoint is intact); `skip_step` leaves the "
      "weights and Adam moments as they are for that step, logs a warning and records "
      "the step in metrics.jsonl with \"skipped\": true.");
}

// ---- train: where and how exactly the step runs
void add_train_device_keys(Registry& r) {
  r.add_enum<DeviceKind>(
      "train.device", [](StageConfig& c) -> DeviceKind& { return c.train.device; },
      {{"auto", 0}, {"cpu", 1}, {"cuda", 2}},
      "Backend: `cpu` (fp32 reference, MPI), `cuda` (bf16 parameters and activations, fp32 "
      "gradients, master weights and Adam moments on the GPU, NCCL; refused when the build has "
      "no CUDA or no device is visible), or `auto` (cuda when the build has CUDA and a device "
      "is visible, else cpu).");
  r.add_bool(
      "train.deterministic", [](StageConfig& c) -> bool& { return c.train.deterministic; },
      "CUDA: `true` makes reruns and resumed runs bit-identical to an uninterrupted run: the "
      "attention backward then adds dQ in a fixed order: on an sm_90 GPU through easyctx's Hopper "
      "backward (`train.hopper_attention`) at head dim 128 (~3% of a llama2-7b step at 32K on "
      "H200) and at head dim 64 for blocks without a mask and from 16K query rows on (~10-11% "
      "of a 1B step at 32K-64K), else through cuDNN's deterministic graph (dP of a 4096 x 4096 "
      "tile kept in cuDNN's workspace: 1 GiB for 32 heads), which costs 19-22% of a 1B step at "
      "32K-64K tokens on H200. `false` (the default, as PyTorch's cuDNN backward) uses cuDNN's atomic dQ accumulation: "
      "a "
      "GPU's whole sequence in one call with the gradients written in place (an f32 dQ accumulator "
      "of the sequence in cuDNN's workspace), a ring's blocks in 8192-token tiles; the attention "
      "backward is 1.35x (32 x 128) to 1.6x (GQA 32/4 x 64) faster, and the last bits of dQ vary "
      "between runs, so a rerun or a resumed run matches within rounding, not bit for bit. The "
      "CPU backend is always deterministic.");
  r.add_bool(
      "train.hopper_attention", [](StageConfig& c) -> bool& { return c.train.hopper_attention; },
      "CUDA on an sm_90 GPU (H100, H200): `true` (the default) runs the attention forward on "
      "easyctx's own Hopper kernel (kernels/attention_fwd_sm90.cu: TMA, wgmma, warp-specialised) "
      "where it measured faster than cuDNN 9.19's in the same process (bench/RESULTS.md): head "
      "dim 64 always, head dim 128 for causal and partially masked blocks (cuDNN keeps the "
      "unmasked ones); elsewhere it replaces the slower FlashAttention-2 style kernel as the "
      "fallback (ring blocks with the diagonal inside). The kernel is deterministic, so "
      "`train.deterministic` keeps its promise either way. The backward likewise: easyctx's "
      "Hopper backward kernel (kernels/attention_bwd_sm90.cu) where it measured faster than "
      "cuDNN's backward of the same mode, i.e. with `train.deterministic: true` at head dim 128 "
      "(1.06-1.30x cuDNN's deterministic graph) and at head dim 64 for unmasked blocks and from "
      "16K query rows on (1.28-1.52x); in place "
      "of the FlashAttention-2 style kernel elsewhere (cuDNN's atomic backward stays first). "
      "`false`: cuDNN's attention as before these kernels, the FlashAttention-2 style kernels as "
      "the fallback. Ignored on other GPUs (A100: sm_80) and the CPU.");
}

// ---- lora (docs/training.md, "LoRA")
void add_lora_keys(Registry& r) {
  // They decide which tensors train and how (a resume refuses a checkpoint of another lora
  // section: Trainer::check_lora_checkpoint); the keys after them are the run's again.
  r.role = KeyRole::kTraining;
  r.add_int(
      "lora.rank", [](StageConfig& c) -> int64_t& { return c.lora.rank; }, 0, 65536,
      "LoRA rank r: 0 (the default) trains every weight; r > 0 freezes the base model in the compute dtype "
      "(bf16 on CUDA, f32 on the CPU: no master copy, gradient or Adam state for it) and trains, per "
      "targeted projection y = x W^T, the adapters A [r, in] and B [out, r] of y = x W^T + scale x A^T B^T, "
      "plus the whole tensors lora.trainable names. A starts Kaiming-uniform (torch's kaiming_uniform_ with "
      "a = sqrt(5), as PEFT: U(-1/sqrt(in), 1/sqrt(in))) from train.seed, B at 0, so the first step's model "
      "is the base. The backward skips the frozen weights' gradients. Checkpoints hold the trainable tensors "
      "and their Adam moments only and name the base; the export is a PEFT adapter folder "
      "(docs/model.md, \"LoRA adapters\").");
  r.add_float(
      "lora.alpha", [](StageConfig& c) -> double& { return c.lora.alpha; }, 0, true, kMaxF, false,
      "PEFT's lora_alpha: the adapters' output is scaled by alpha / rank (alpha / sqrt(rank) with "
      "lora.use_rslora).");
  r.add_bool(
      "lora.use_rslora", [](StageConfig& c) -> bool& { return c.lora.use_rslora; },
      "Rank-stabilised LoRA (PEFT's use_rslora): scale alpha / sqrt(rank) instead of alpha / rank.");
  r.add_list(
      "lora.targets", [](StageConfig& c) -> std::string& { return c.lora.targets; },
      "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (comma-separated or a YAML list)",
      "The projections of every decoder layer that get adapters, by PEFT's (and Hugging Face's) module "
      "names; PEFT's target_modules in the exported adapter_config.json.");
  r.add_list(
      "lora.trainable", [](StageConfig& c) -> std::string& { return c.lora.trainable; },
      "embed_tokens, lm_head, norm (comma-separated or a YAML list; empty: none)",
      "Whole tensors trained beside the adapters (PEFT's modules_to_save; LongLoRA's \"+\", which it found "
      "needed to extend the context): `embed_tokens` the token embedding, `lm_head` the output matrix "
      "(refused with tied embeddings, as is embed_tokens: PEFT's modules_to_save would untie them), `norm` "
      "every RMSNorm gain (the layers' input and post-attention norms, qwen3's q/k norms and the final "
      "norm). They keep fp32 master weights and Adam moments like a full fine-tune.");
  r.add_float(
      "lora.dropout", [](StageConfig& c) -> double& { return c.lora.dropout; }, 0, false, 1, true,
      "PEFT's lora_dropout on the adapters' input: only 0 is implemented (a non-zero value is refused).");
  r.role = KeyRole::kRun;
}

}  // namespace easyctx::config_schema
