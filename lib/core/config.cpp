#include "core/config.h"

#include "core/checked.h"
#include "core/error.h"

namespace easyctx {

const char* to_string(SeqParallelMode m) {
  switch (m) {
    case SeqParallelMode::None: return "none";
    case SeqParallelMode::ZigzagRing: return "zigzag_ring";
    case SeqParallelMode::Ulysses: return "ulysses";
    case SeqParallelMode::DistFlash: return "dist_flash";
    case SeqParallelMode::Usp: return "usp";
  }
  return "?";
}
const char* to_string(LrSchedule s) {
  switch (s) {
    case LrSchedule::Constant: return "constant";
    case LrSchedule::Linear: return "linear";
    case LrSchedule::Cosine: return "cosine";
  }
  return "?";
}
const char* to_string(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::None: return "none";
    case CheckpointPolicy::Layer: return "layer";
    case CheckpointPolicy::AttentionOutput: return "attention_output";
  }
  return "?";
}
const char* to_string(OffloadTarget o) { return o == OffloadTarget::Cpu ? "cpu" : "none"; }
const char* to_string(DeviceKind d) {
  switch (d) {
    case DeviceKind::Auto: return "auto";
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda";
  }
  return "?";
}
const char* to_string(ZeroGroupScope z) { return z == ZeroGroupScope::Node ? "node" : "world"; }
const char* to_string(NonFinitePolicy p) { return p == NonFinitePolicy::SkipStep ? "skip_step" : "stop"; }

void validate_activation(const StageConfig& c) {
  const std::string& src = c.source.empty() ? std::string("config") : c.source;
  EASYCTX_CHECK_INPUT(c.activation.offload == OffloadTarget::None || c.activation.checkpoint != CheckpointPolicy::None,
                      src,
                      ": activation.offload: cpu needs activation.checkpoint layer or attention_output (it "
                      "moves the checkpoints those keep to host memory; with activation.checkpoint none every "
                      "activation stays on the device); set activation.checkpoint: layer or activation.offload: none");
  EASYCTX_CHECK_INPUT(c.activation.offload_layers == 0 || c.activation.offload == OffloadTarget::Cpu, src,
                      ": activation.offload_layers: ", c.activation.offload_layers,
                      " needs activation.offload: cpu "
                      "(it counts the checkpoints that go to host memory); set activation.offload: cpu or "
                      "activation.offload_layers: 0");
  EASYCTX_CHECK_INPUT(c.activation.attention_output_layers == 0 || !c.activation.checkpoint_auto, src,
                      ": activation.attention_output_layers: ", c.activation.attention_output_layers,
                      " with activation.checkpoint: auto (the plan chooses how many layers keep their attention "
                      "output); set activation.checkpoint: attention_output to fix the count, or "
                      "activation.attention_output_layers: 0");
  EASYCTX_CHECK_INPUT(
      c.activation.attention_output_layers == 0 || c.activation.checkpoint == CheckpointPolicy::AttentionOutput, src,
      ": activation.attention_output_layers: ", c.activation.attention_output_layers,
      " needs activation.checkpoint: attention_output (it counts the layers that keep their "
      "attention output); set activation.checkpoint: attention_output or "
      "activation.attention_output_layers: 0");
}

void validate_for_world(const StageConfig& c, int world_size) {
  const std::string& src = c.source.empty() ? std::string("config") : c.source;
  const auto& sp = c.parallel.sequence;
  EASYCTX_CHECK_INPUT(world_size % sp.size == 0, src, ": parallel.sequence.size = ", sp.size,
                      " does not divide the world size ", world_size,
                      " (world = data-parallel x sequence-parallel); use a divisor of ", world_size);
  if (sp.mode == SeqParallelMode::None)
    EASYCTX_CHECK_INPUT(sp.size == 1, src, ": parallel.sequence.size = ", sp.size,
                        " needs a sequence-parallel mode; set parallel.sequence.mode to zigzag_ring, ulysses, "
                        "dist_flash or usp, or size to 1");
  if (sp.mode == SeqParallelMode::Usp && sp.ulysses_size > 0)
    EASYCTX_CHECK_INPUT(sp.size % sp.ulysses_size == 0, src, ": parallel.sequence.ulysses_size = ", sp.ulysses_size,
                        " must divide parallel.sequence.size = ", sp.size);
  if (sp.mode != SeqParallelMode::Usp)
    EASYCTX_CHECK_INPUT(sp.ulysses_size == 0, src,
                        ": parallel.sequence.ulysses_size is only used with mode usp "
                        "(mode is ",
                        to_string(sp.mode), ")");
  const auto& z = c.parallel.zero;
  EASYCTX_CHECK_INPUT(z.stage == 0 || z.stage == 3, src, ": parallel.zero.stage: bad value '", z.stage,
                      "': expected 0 or 3");
  EASYCTX_CHECK_INPUT(!z.offload_params || z.stage == 3, src,
                      ": parallel.zero.offload_params needs parallel.zero.stage = 3");
  EASYCTX_CHECK_INPUT(!z.offload_params || z.offload_optimizer, src,
                      ": parallel.zero.offload_params needs parallel.zero.offload_optimizer = true (the host AdamW "
                      "writes the bf16 shards it keeps in host memory)");
  EASYCTX_CHECK_INPUT(!z.offload_grads || (z.stage == 3 && z.offload_optimizer), src,
                      ": parallel.zero.offload_grads needs parallel.zero.stage = 3 and "
                      "parallel.zero.offload_optimizer = true (the host AdamW reads the gradient shards it keeps in "
                      "host memory)");
  EASYCTX_CHECK_INPUT(z.offload_optimizer_layers == 0 || (z.stage == 0 && z.offload_optimizer), src,
                      ": parallel.zero.offload_optimizer_layers = ", z.offload_optimizer_layers,
                      " needs parallel.zero.stage = 0 and parallel.zero.offload_optimizer = true (it splits the "
                      "replicated optimizer between the GPU and host memory); set it to 0");
  EASYCTX_CHECK_INPUT(c.train.warmup_steps <= c.train.steps || c.train.steps == 0, src,
                      ": train.warmup_steps = ", c.train.warmup_steps, " exceeds train.steps = ", c.train.steps);
  EASYCTX_CHECK_INPUT(c.train.min_lr <= c.train.lr, src, ": train.min_lr = ", c.train.min_lr,
                      " exceeds train.lr = ", c.train.lr);
  check_derived_sizes(c, world_size);
}

void check_derived_sizes(const StageConfig& c, int world_size) {
  const std::string& src = c.source.empty() ? std::string("config") : c.source;
  EASYCTX_CHECK_INPUT(world_size > 0 && c.parallel.sequence.size > 0, src, ": world size ", world_size,
                      " and parallel.sequence.size ", c.parallel.sequence.size, " must be > 0");
  const int64_t dp = world_size / c.parallel.sequence.size;
  // Tokens of one micro-batch on one rank before the sequence split: the model's activations
  // are checked against it (LlamaModel's workspace), the loader allocates it.
  checked_elements({c.train.batch_size, c.data.seq_length + 1},
                   src + ": tokens per micro-batch, train.batch_size x (data.seq_length + 1)");
  const int64_t global = checked_product({c.train.batch_size, c.train.grad_accum, dp},
                                         src +
                                             ": global batch, train.batch_size x train.grad_accum x data-parallel "
                                             "size (world / parallel.sequence.size)");
  // Sample indices (step x global batch + k) and the run's token count stay inside int64.
  checked_product({checked_add<int64_t>(c.train.steps, 1, src + ": train.steps + 1"), global, c.data.seq_length + 1},
                  src + ": tokens of the run, (train.steps + 1) x global batch x (data.seq_length + 1)");
}

}  // namespace easyctx
