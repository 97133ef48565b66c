// The stage-config keys of the output, logging and target sections (config_schema.cpp's
// registry() adds them).
#include "core/config_schema_keys.h"

namespace easyctx::config_schema {
namespace {

std::string check_level(const std::string& s) {
  return (s == "debug" || s == "info" || s == "warn" || s == "error") ? "" : "one of debug, info, warn, error";
}

}  // namespace

using config_registry::KeyRole;
using config_registry::Registry;

// ---- output
void add_output_keys(Registry& r) {
  r.add_string(
      "output.dir", [](StageConfig& c) -> std::string& { return c.output.dir; }, "path",
      "Run folder: run.json (the run it holds), plan.json (its memory plan, as --plan computes it), "
      "metrics.jsonl, logs/, checkpoints/, final/ (the HF export), DONE, previous/ (earlier runs' DONE, "
      "final/, plan.json and metrics, set-aside checkpoints).",
      check_nonempty);
  r.add_int(
      "output.save_every", [](StageConfig& c) -> int64_t& { return c.output.save_every; }, 0, kMaxI,
      "Save a checkpoint every N optimizer steps (0: only at the end). A SIGUSR1, SIGUSR2, SIGTERM or SIGINT "
      "on any rank also saves one (unless this run has just saved that step, or this process has not "
      "trained a step yet) and stops the run with exit "
      "code 0 (130 for SIGINT; docs/training.md, \"Stopping a run\"; Slurm: --signal=B:USR1@300).");
  r.add_int(
      "output.keep_last", [](StageConfig& c) -> int64_t& { return c.output.keep_last; }, 1, kMaxI,
      "Checkpoints of this run to keep (the run <output.dir>/run.json names). Older ones of this run are "
      "pruned only after a newer one has committed and verified; checkpoints of other runs in the folder "
      "are never pruned (docs/training.md, \"Checkpoint safety\").");
  r.add_bool(
      "output.save_final", [](StageConfig& c) -> bool& { return c.output.save_final; },
      "Save a checkpoint after the last step (the next stage's model.init ckpt:DIR, and --resume). "
      "false only for benchmarks and throw-away runs: nothing of the run is kept but metrics and the "
      "HF export.");
  r.add_bool(
      "output.export_hf", [](StageConfig& c) -> bool& { return c.output.export_hf; },
      "At the end of the stage, export the weights as a Hugging Face folder <output.dir>/final "
      "(config.json with the stage's rope_theta, model.safetensors) that transformers loads "
      "(tests/golden/check_export.py, run where transformers is installed).");
  r.add_string(
      "output.hf_dtype", [](StageConfig& c) -> std::string& { return c.output.hf_dtype; }, "f32, bf16",
      "Tensor type of the Hugging Face export: f32 (exact master weights) or bf16 (half the size).",
      [](const std::string& s) { return (s == "f32" || s == "bf16") ? "" : "f32 or bf16"; });
}

// ---- logging
void add_logging_keys(Registry& r) {
  r.add_int(
      "logging.every", [](StageConfig& c) -> int64_t& { return c.logging.every; }, 1, kMaxI,
      "Print the step line every N steps (metrics.jsonl gets every step).");
  r.add_bool(
      "logging.per_rank", [](StageConfig& c) -> bool& { return c.logging.per_rank; },
      "Also write every rank's log to <output.dir>/logs/rank<R>.log.");
  r.add_bool(
      "logging.metrics", [](StageConfig& c) -> bool& { return c.logging.metrics; },
      "Write <output.dir>/metrics.jsonl (one JSON object per step).");
  r.add_bool(
      "logging.tensorboard", [](StageConfig& c) -> bool& { return c.logging.tensorboard; },
      "Write TensorBoard event files to <output.dir>/tensorboard/ (rank 0): per step the numbers of "
      "metrics.jsonl as scalars train/<name>, readable while the run goes (`tensorboard --logdir "
      "<output.dir>/tensorboard`) and uploadable with `wandb sync --sync-tensorboard` (docs/training.md, "
      "\"Live tracking\"). A resumed run adds a file; steps continue. easyctx_train's --wandb NAME "
      "(EasyContext's flag) sets it.");
  r.add_string(
      "logging.level", [](StageConfig& c) -> std::string& { return c.logging.level; }, "debug, info, warn, error",
      "Log verbosity.", check_level);
  r.add_bool(
      "logging.profile", [](StageConfig& c) -> bool& { return c.logging.profile; },
      "Time every op of the backend (CUDA: events on its stream) and the step's phases (data, "
      "forward+backward, gradient reduction, clip, optimizer; the backend is synchronized between "
      "them) over every step but the first; at the end print the time per step by op and by op and "
      "shape with achieved TFLOP/s, and write <output.dir>/profile.json (docs/performance.md). Adds a "
      "synchronization per phase: leave it off for the tokens/s you report.");
}

// ---- target (the memory plan, lib/plan; docs/memory-model.md)
void add_target_keys(Registry& r) {
  r.add_string(
      "target.gpu", [](StageConfig& c) -> std::string& { return c.target.gpu; },
      "\"\", A100-40GB, A100-80GB, H100-80GB, H200, or any name with target.gpu_memory_gib",
      "GPU model the memory plan sizes the run for. Empty: the visible device (its name and memory). A "
      "known model gives the memory (as nvidia-smi reports it); any other name needs "
      "target.gpu_memory_gib. With train.device auto and no visible GPU, setting it plans for cuda.");
  r.add_float(
      "target.gpu_memory_gib", [](StageConfig& c) -> double& { return c.target.gpu_memory_gib; }, 0, false, kMaxF,
      false, "Memory of one GPU in GiB (overrides the model's). 0: from target.gpu or the visible device.");
  r.add_int(
      "target.gpus_per_node", [](StageConfig& c) -> int64_t& { return c.target.gpus_per_node; }, 0, 1 << 20,
      "Ranks per node the plan assumes (one per GPU; processes per node on the CPU backend). 0: the "
      "launch's (mpirun), 1 for a plain `easyctx_train STAGE.yaml --plan`.");
  r.add_int(
      "target.nodes", [](StageConfig& c) -> int64_t& { return c.target.nodes; }, 0, 1 << 20,
      "Nodes the plan assumes; the world is target.nodes x target.gpus_per_node, and "
      "parallel.sequence.size must divide it. 0: the launch's.");
  r.add_float(
      "target.host_memory_gib", [](StageConfig& c) -> double& { return c.target.host_memory_gib; }, 0, false, kMaxF,
      false, "Host memory of one node in GiB. 0: MemTotal of the machine running the plan.");
  r.add_float(
      "target.headroom", [](StageConfig& c) -> double& { return c.target.headroom; }, 0, false, 1, true,
      "Share of each GPU's and each node's memory the plan keeps free (allocator fragmentation, "
      "other processes): a run fits when its predicted peak is at most (1 - headroom) x capacity.");
}

}  // namespace easyctx::config_schema
