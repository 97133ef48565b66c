// The registry of every stage-config key: type, allowed values, default, documentation.
// Parsing (YAML file and --set), validation, dumping and docs/config.md all walk this table.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>

#include "core/config.h"
#include "core/config_registry.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/yaml_error.h"

namespace easyctx {
namespace {

using config_registry::EnumChoice;
using config_registry::Field;
using config_registry::KeyRole;
using config_registry::quote_if_needed;
using config_registry::Registry;

constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();
constexpr double kMaxF = std::numeric_limits<double>::max();
// Positions are int32 and a sequence-parallel layout pads the sequence: 2^30 leaves room.
constexpr int64_t kMaxSeqLength = int64_t{1} << 30;

std::string check_init(const std::string& s) {
  if (s == "random" || (starts_with(s, "hf:") && s.size() > 3) || (starts_with(s, "ckpt:") && s.size() > 5)) return "";
  return "random, hf:DIR or ckpt:DIR";
}
std::string check_nonempty(const std::string& s) { return s.empty() ? "a non-empty string" : ""; }
std::string check_level(const std::string& s) {
  return (s == "debug" || s == "info" || s == "warn" || s == "error") ? "" : "one of debug, info, warn, error";
}

// Packing and masking of document data (h5tokenize chat shards and any shards with documents);
// docs/data.md, "Packing", has the rules these keys select.
void add_data_packing_keys(Registry& r) {
  r.role = KeyRole::kTraining;  // they decide which tokens a sequence holds and what it predicts
  r.add_enum<DataPacking>(
      "data.packing", [](StageConfig& c) -> DataPacking& { return c.data.packing; },
      {{"window", static_cast<int>(DataPacking::Window)},
       {"best_fit", static_cast<int>(DataPacking::BestFit)},
       {"one_per_window", static_cast<int>(DataPacking::OnePerWindow)}},
      "How documents fill the seq_length-token sequences. `window`: the token stream cut into windows that cross "
      "document boundaries (pre-training). `best_fit`: whole documents placed by best-fit decreasing within "
      "shuffled pools of 4096, the rest of a sequence padded (label -1). `one_per_window`: one document per "
      "sequence, padded. Packed once from train.seed; each epoch visits the sequences in a new order.");
  r.add_enum<LongDocuments>(
      "data.long_documents", [](StageConfig& c) -> LongDocuments& { return c.data.long_documents; },
      {{"split", static_cast<int>(LongDocuments::Split)}, {"refuse", static_cast<int>(LongDocuments::Refuse)}},
      "data.packing best_fit or one_per_window: a document longer than seq_length is cut into seq_length-token "
      "pieces packed as documents (`split`), or is an error naming its file and index (`refuse`).");
  r.add_bool(
      "data.document_mask", [](StageConfig& c) -> bool& { return c.data.document_mask; },
      "Documents inside a sequence are kept apart: positions restart at 0 at each document's "
      "start (as Hugging Face's position_ids for packed batches), the label that would predict the next "
      "document's first token is dropped, and attention never crosses a document border (block-diagonal; "
      "in every parallel.sequence.mode, blocks of attention with no query and key in the same document "
      "are skipped). false: one document per sequence, positions 0..seq_length-1 (pre-training "
      "behaviour). For SFT: true with data.packing best_fit (docs/data.md, \"Document masking\").");
}

// ---- model
void add_model_keys(Registry& r) {
  r.role = KeyRole::kTraining;
  r.add_string(
      "model.config", [](StageConfig& c) -> std::string& { return c.model.config; },
      "preset name, .yaml or config.json path",
      "Model shape: a preset name from configs/models/ (tiny, tinyllama-1b, llama2-7b, llama2-13b, "
      "llama3-8b, ...), a model YAML file, or a Hugging Face config.json (or the folder holding it). "
      "With model.init hf:DIR the folder's config.json gives the model: leave this at its default, or give a "
      "config of the same model (a different one is an error naming both).",
      check_nonempty);
  r.role = KeyRole::kRun;  // where a new run starts: a resume continues from its checkpoint
  r.add_string(
      "model.init", [](StageConfig& c) -> std::string& { return c.model.init; }, "random, hf:DIR, ckpt:DIR",
      "Initial weights: `random` (normal with model.init_std), `hf:DIR` (Hugging Face safetensors), or "
      "`ckpt:DIR` (an easyctx checkpoint, e.g. the previous stage's output).",
      check_init);
  r.role = KeyRole::kTraining;
  r.add_float(
      "model.rope_theta", [](StageConfig& c) -> double& { return c.model.rope_theta; }, 0, false, kMaxF, false,
      "RoPE base for this stage; 0 keeps the model's. Progressive recipes raise it every stage.");
  r.role = KeyRole::kRun;
  r.add_bool(
      "model.carry_optimizer", [](StageConfig& c) -> bool& { return c.model.carry_optimizer; },
      "With model.init ckpt:DIR (stage chaining), also start from that checkpoint's Adam moments instead of "
      "fresh ones (the step count and schedule restart at 0).");
  r.add_float(
      "model.init_std", [](StageConfig& c) -> double& { return c.model.init_std; }, 0, true, kMaxF, false,
      "Standard deviation of random initialisation (model.init: random).");
}

// ---- data
void add_data_keys(Registry& r) {
  r.role = KeyRole::kTraining;
  r.add_string(
      "data.path", [](StageConfig& c) -> std::string& { return c.data.path; }, "file, folder or glob",
      "Pre-tokenized HDF5 shards written by h5tokenize: one .h5 file, a folder of them, or a glob.");
  r.add_int(
      "data.seq_length", [](StageConfig& c) -> int64_t& { return c.data.seq_length; }, 2, kMaxSeqLength,
      "Tokens per training sequence; each sample is a window of seq_length + 1 tokens. Any length up to "
      "2^30 works (positions are int32): sequence-parallel modes pad and mask as they need.");
  r.role = KeyRole::kRun;
  r.add_bool(
      "data.check_tokens", [](StageConfig& c) -> bool& { return c.data.check_tokens; },
      "Check every token id of every window against the model's vocabulary before use.");
}

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

// ---- parallel
void add_parallel_keys(Registry& r) {
  r.add_enum<SeqParallelMode>(
      "parallel.sequence.mode", [](StageConfig& c) -> SeqParallelMode& { return c.parallel.sequence.mode; },
      {{"none", 0}, {"zigzag_ring", 1}, {"ulysses", 2}, {"dist_flash", 3}, {"usp", 4}},
      "How one sequence is split across a sequence-parallel group: `none` (data parallel only; size must be "
      "1), `zigzag_ring` (2W chunks, ring attention; the default, and with size 1 the same as none), `ulysses` "
      "(all-to-all to heads), `dist_flash` (LightSeq's load-balanced "
      "schedule), `usp` (Ulysses inside x ring across). EasyContext's names are accepted too: "
      "`zigzag_ring_attn`, `ulysses_attn`, `dist_flash_attn`, `usp_attn`, `data_parallel` (= none); "
      "--print-config shows easyctx's.",
      {{"data_parallel", 0}, {"zigzag_ring_attn", 1}, {"ulysses_attn", 2}, {"dist_flash_attn", 3}, {"usp_attn", 4}});
  r.add_int(
      "parallel.sequence.size", [](StageConfig& c) -> int64_t& { return c.parallel.sequence.size; }, 1, kMaxI,
      "Ranks per sequence-parallel group (contiguous ranks). World = data-parallel x this.");
  r.add_int(
      "parallel.sequence.ulysses_size", [](StageConfig& c) -> int64_t& { return c.parallel.sequence.ulysses_size; }, 0,
      kMaxI,
      "usp only: Ulysses degree inside each sequence-parallel group (contiguous ranks); the ring degree is "
      "size / ulysses_size. 0 picks the ranks per node (capped at size).");
  r.add_int(
      "parallel.sequence.ring_degree", [](StageConfig& c) -> int64_t& { return c.parallel.sequence.ring_degree; }, 0,
      kMaxI,
      "usp only, EasyContext's --ring_degree: ranks in each ring of a sequence-parallel group; sets "
      "ulysses_size = size / ring_degree (it must divide size; a ulysses_size given as well must equal "
      "that). 0: not given (ulysses_size decides).");
}

// ---- parallel.zero (and the collectives' timeout)
void add_zero_keys(Registry& r) {
  r.add_int(
      "parallel.zero.stage", [](StageConfig& c) -> int64_t& { return c.parallel.zero.stage; }, 0, 3,
      "0: replicated weights and optimizer, gradients all-reduced. 3: master weights, gradients and Adam "
      "state sharded over the ZeRO group by unit (embedding, each layer, head); each layer's parameters are "
      "gathered just before use and its gradient reduce-scattered right after its backward (CPU and CUDA; "
      "docs/training.md). Only 0 and 3 exist.");
  r.add_bool_or_auto(
      "parallel.zero.offload_optimizer", [](StageConfig& c) -> bool& { return c.parallel.zero.offload_optimizer; },
      [](StageConfig& c) -> bool& { return c.parallel.zero.offload_optimizer_auto; },
      "auto (the default): the memory plan chooses, before anything is allocated: the optimizer stays on "
      "the GPU when the run fits there with it (the fastest place); else, with activation.offload none, "
      "it stays there if the fewest layer inputs moved to pinned host memory make room (activation.offload "
      "cpu with that activation.offload_layers: copies that overlap the layers' compute, far cheaper than "
      "a host update; set true or false to keep the layer inputs where activation.offload says); else, "
      "stage 0, it splits: the fewest last layers (with the head) whose state moved to host memory make "
      "room for the rest on the GPU (offload_optimizer_layers); else it moves to host memory as with "
      "true (the plan's notes and the trainer's log say which; "
      "offload_params or offload_grads imply true; on train.device cpu it means false). true, "
      "train.device cuda: keep the fp32 master weights and Adam moments in host memory (stage 3: each "
      "rank's shards of them) and run AdamW on the host's threads; fp32 gradients stream down and bf16 "
      "weights back up in chunks through pinned staging, overlapped with the host update (saves 12 bytes "
      "per parameter on each GPU, 12/Z with stage 3; docs/memory-model.md). The update runs on a host "
      "thread while the next step's forward starts, each unit waited for only when the forward reaches it "
      "(same weights, bit for bit). Bound by host memory bandwidth: it pays for long steps (long context).");
  r.add_int(
      "parallel.zero.offload_optimizer_layers",
      [](StageConfig& c) -> int64_t& { return c.parallel.zero.offload_optimizer_layers; }, 0, kMaxI,
      "With offload_optimizer on train.device cuda, stage 0: how many layers keep their fp32 master "
      "weights and Adam moments in host memory, counted from the last layer back, with the head's (0: "
      "every unit's, the embedding's too; values at or above the layer count mean the same). The "
      "embedding's and the other layers' stay on the GPU and are updated there. The forward reaches the "
      "host-updated units last, so the host AdamW of the previous step has the forward of its first "
      "layers to finish in: a split the GPU's spare memory pays for. offload_optimizer auto picks the "
      "fewest that fit when the whole optimizer does not (the plan's notes say so); set by hand it "
      "implies offload_optimizer true. Same weights, bit for bit.");
  r.add_bool(
      "parallel.zero.offload_params", [](StageConfig& c) -> bool& { return c.parallel.zero.offload_params; },
      "Stage 3 with offload_optimizer on train.device cuda: keep each rank's bf16 parameter shards in "
      "pinned host memory too (the host AdamW writes them in place, no upload) and copy a unit's shard to "
      "the GPU just before its all-gather (on the gather stream, so prefetch overlaps it too). Saves 2/Z "
      "bytes per parameter on each GPU, for models whose shards do not fit beside the activations; the "
      "fp32 gradient shard (4/Z) stays on the GPU unless offload_grads (docs/memory-model.md).");
  r.add_bool(
      "parallel.zero.offload_grads", [](StageConfig& c) -> bool& { return c.parallel.zero.offload_grads; },
      "Stage 3 with offload_optimizer on train.device cuda: keep each rank's fp32 gradient shards of the "
      "layers in pinned host memory, so the gradients never sit whole on the GPU. Right after a layer's "
      "reduce-scatter its shard result is copied down (on its own stream) and added into the host shard; "
      "the host AdamW reads it there. Saves 4/Z bytes per layer parameter on each GPU (on one GPU, Z = 1: "
      "the whole fp32 gradient, 32 GB for an 8B model); costs one layer shard of pinned staging per "
      "reduce-scatter buffer and a host add per layer and micro-batch (docs/memory-model.md). The "
      "embedding's and head's gradients stay on the GPU (every token adds into them).");
  r.add_int(
      "parallel.zero.prefetch", [](StageConfig& c) -> int64_t& { return c.parallel.zero.prefetch; }, 0, 8,
      "Stage 3: layers gathered ahead of the one in use (the pool holds 1 + prefetch gathered layers). "
      "On CUDA with NCCL the gathers (and the layers' gradient reduce-scatters) run on their own "
      "stream, so a layer gathered ahead overlaps the compute of the ones before it (1 is enough on "
      "NVLink; each adds one gathered layer of memory).");
  r.add_enum<ZeroGroupScope>(
      "parallel.zero.group", [](StageConfig& c) -> ZeroGroupScope& { return c.parallel.zero.group; },
      {{"world", 0}, {"node", 1}},
      "Ranks that shard one copy of the model: the whole world, or the ranks of one node "
      "(replicated across nodes, gradients all-reduced between the copies).");
  r.add_float(
      "parallel.collective_timeout_s", [](StageConfig& c) -> double& { return c.parallel.collective_timeout_s; }, 0,
      true, kMaxF, false,
      "A collective that has not completed after this many seconds aborts every rank with a message "
      "naming the collective and the group (a peer died or hangs).");
}

// ---- activation
void add_activation_keys(Registry& r) {
  r.add_enum_or_auto<CheckpointPolicy>(
      "activation.checkpoint", [](StageConfig& c) -> CheckpointPolicy& { return c.activation.checkpoint; },
      [](StageConfig& c) -> bool& { return c.activation.checkpoint_auto; }, CheckpointPolicy::Layer,
      {{"none", 0}, {"layer", 1}, {"attention_output", 2}},
      "`none`: keep every activation. `layer`: keep each layer's input and recompute the layer in backward. "
      "`attention_output`: also keep attention output and LSE so attention is never recomputed (LightSeq's "
      "cut; with activation.attention_output_layers, only in the last layers). `auto`: the memory plan chooses "
      "before anything is allocated: `attention_output` in as many of the last layers as fit (every layer when "
      "they all do), with activation.offload none moving the fewest more layer inputs to pinned host memory "
      "that keep the most, else `layer` (the same arithmetic either way; the plan's notes and the trainer's log "
      "say what it chose; docs/memory-model.md). llama2-7b at 64K on one H200: 5,237 tok/s against 4,562 "
      "with `layer` (measured 2026-12-02, bench/RESULTS.md \"activation.checkpoint: auto\").");
  r.add_int(
      "activation.attention_output_layers",
      [](StageConfig& c) -> int64_t& { return c.activation.attention_output_layers; }, 0, kMaxI,
      "With activation.checkpoint attention_output: how many layers keep their attention output and LSE, "
      "counted from the last layer back (0: every layer; values above the layer count mean every layer). "
      "The other layers recompute their attention in backward, as with `layer`. Each kept layer skips "
      "one attention forward (most of a layer's recompute at long context) for tokens x q_dim x 2 bytes "
      "(+ the LSE) of memory: the knob that spends what a `layer` run leaves free on speed, where every "
      "layer's would not fit (the --plan refusal of attention_output names the most layers that fit). "
      "With activation.offload cpu, the kept outputs of layers whose input leaves go to host memory too "
      "(layers below offload_layers - 1), the rest stay on the device. The same arithmetic as `layer` (bit-identical "
      "on the CPU and with train.deterministic true).");
  r.add_enum<OffloadTarget>(
      "activation.offload", [](StageConfig& c) -> OffloadTarget& { return c.activation.offload; },
      {{"none", 0}, {"cpu", 1}},
      "Where the checkpoints of activation.checkpoint layer / attention_output live. "
      "`none`: on the device. `cpu`: in pinned host memory; the device keeps a ring of two "
      "of each, copies each layer's checkpoint out while the next layer computes and brings "
      "it back one layer ahead of the backward (on the CPU backend the same path copies "
      "between host buffers). Saves (L - 1) x tokens x hidden x 2 bytes per GPU at bf16, "
      "plus the attention outputs with attention_output; bit-identical results; needs "
      "checkpoint layer or attention_output (docs/memory-model.md). With attention_output "
      "and attention_head_groups > 1 the attention outputs stream per head group: every "
      "layer's in host memory, two group-sized slots on the device.");
  r.add_int(
      "activation.offload_layers", [](StageConfig& c) -> int64_t& { return c.activation.offload_layers; }, 0, kMaxI,
      "With activation.offload cpu: how many layer inputs go to host memory, from the first layer on (0: "
      "all that can, L - 1). The rest stay on the device, so a run takes only the host memory and PCIe "
      "traffic it needs to fit (the --plan refusal names the smallest count that fits); values above L - 1 "
      "mean L - 1. With attention_output, one attention output fewer than layer inputs leaves.");
  r.add_int(
      "activation.attention_head_groups", [](StageConfig& c) -> int64_t& { return c.activation.attention_head_groups; },
      1, kMaxI,
      "Tile each layer's attention block over G head groups of num_heads / G query and "
      "num_kv_heads / G key/value heads: per group the Q/K/V projections, RoPE, the attention and the "
      "output projection's partial sum, forward and backward, so q, k, v, o and dq, dk, dv (and every "
      "buffer the attention keeps per call: the zigzag ring's K/V double buffer and fp32 accumulators, "
      "Ulysses' all-to-all buffers, cuDNN's workspace) hold one group: G-fold smaller. checkpoint layer "
      "recomputes each group's attention forward once more in backward (attention_output reads it from "
      "the checkpoint); checkpoint none keeps every group's activations. Within fp32 rounding of G = 1 "
      "(the forward bit for bit on the CPU when num_heads / G x head_dim is a multiple of 256). Must "
      "divide num_kv_heads (and, with ulysses/usp, leave heads divisible by the Ulysses size). Pays off "
      "at long context (docs/memory-model.md). Evaluations (--attention-head-groups) split only the "
      "attention call.");
  r.add_int(
      "activation.mlp_tile", [](StageConfig& c) -> int64_t& { return c.activation.mlp_tile; }, 0, kMaxI,
      "Tokens per MLP tile along the sequence (0: one tile). With checkpoint layer or attention_output the "
      "[tokens, intermediate] MLP activations and their gradients shrink to [mlp_tile, intermediate], "
      "recomputed tile by tile in backward (refused with checkpoint none).");
  r.add_int(
      "activation.lm_head_tile", [](StageConfig& c) -> int64_t& { return c.activation.lm_head_tile; }, 1, kMaxI,
      "Tokens per LM-head + cross-entropy tile; full logits never exist.");
}

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

const Registry& registry() {
  static const Registry reg = [] {
    Registry r;
    add_model_keys(r);
    add_data_keys(r);
    add_data_packing_keys(r);
    add_train_keys(r);
    // The rest say where and how a run goes (the device, the layout over the ranks, memory,
    // output, logging, the plan's target), not what it trains.
    r.role = KeyRole::kRun;
    add_train_device_keys(r);
    add_parallel_keys(r);
    add_zero_keys(r);
    add_activation_keys(r);
    add_output_keys(r);
    add_logging_keys(r);
    add_target_keys(r);
    return r;
  }();
  return reg;
}

std::string where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// key_loc locates the key (unknown-key errors), loc the value (bad-value errors).
void set_field(StageConfig& cfg, const std::string& key, const std::string& scalar, const std::string& loc,
               const std::string& key_loc = "") {
  const Registry& r = registry();
  const Field* f = r.find(key);
  if (!f) {
    const std::string& loc_k = key_loc.empty() ? loc : key_loc;
    if (r.is_section(key))
      EASYCTX_THROW_INPUT(loc_k, ": '", key, "' is a section, not a value; set one of its keys (", key, ".*)");
    std::string hint = nearest(key, r.keys_and_sections());
    EASYCTX_THROW_INPUT(loc_k, ": unknown key '", key, "'", hint.empty() ? "" : " (did you mean '" + hint + "'?)",
                        "; see docs/config.md");
  }
  std::string expected = f->set(cfg, scalar);
  if (!expected.empty()) EASYCTX_THROW_INPUT(loc, ": ", key, ": bad value '", scalar, "': expected ", expected);
}

void walk(StageConfig& cfg, const YAML::Node& node, const std::string& prefix, const std::string& source) {
  const Registry& r = registry();
  std::vector<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node& kn = it->first;
    const YAML::Node& vn = it->second;
    std::string loc = where(source, kn.Mark());
    EASYCTX_CHECK_INPUT(kn.IsScalar(), loc, ": keys must be plain names");
    std::string key = prefix.empty() ? kn.Scalar() : prefix + "." + kn.Scalar();
    for (const auto& k : seen) EASYCTX_CHECK_INPUT(k != key, loc, ": duplicate key '", key, "'");
    seen.push_back(key);
    if (vn.IsMap()) {
      if (r.find(key)) EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got a mapping");
      if (!r.is_section(key)) set_field(cfg, key, "", loc);  // unknown key error with suggestion
      walk(cfg, vn, key, source);
    } else if (vn.IsScalar()) {
      set_field(cfg, key, vn.Scalar(), where(source, vn.Mark()), loc);
    } else if (vn.IsNull()) {
      if (!r.find(key) && !r.is_section(key)) set_field(cfg, key, "", loc);
      if (r.find(key)) EASYCTX_THROW_INPUT(loc, ": ", key, ": missing value: expected ", r.find(key)->allowed);
      // An empty section ("train:") is fine.
    } else {
      if (!r.find(key) && !r.is_section(key)) set_field(cfg, key, "", loc);
      EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got a list");
    }
  }
}

// EasyContext's ring degree is the inverse of easyctx's Ulysses degree inside a group of
// `size` ranks (usp: size = ulysses_size x ring degree); resolved once the whole file and the
// overrides are read, as the keys may come in any order.
void resolve_ring_degree(StageConfig& cfg) {
  auto& sp = cfg.parallel.sequence;
  if (sp.ring_degree == 0) return;
  const std::string& src = cfg.source.empty() ? std::string("config") : cfg.source;
  EASYCTX_CHECK_INPUT(sp.mode == SeqParallelMode::Usp, src, ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " is only used with mode usp (usp_attn); mode is ", to_string(sp.mode));
  EASYCTX_CHECK_INPUT(sp.size % sp.ring_degree == 0, src, ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " must divide parallel.sequence.size = ", sp.size);
  const int64_t u = sp.size / sp.ring_degree;
  EASYCTX_CHECK_INPUT(sp.ulysses_size == 0 || sp.ulysses_size == u, src,
                      ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " means ulysses_size = size / ring_degree = ", u, ", but ulysses_size = ", sp.ulysses_size,
                      " is set too; give one of them");
  sp.ulysses_size = u;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& f : registry().fields) out.push_back(f.key);
  return out;
}

std::string config_value(const StageConfig& cfg, const std::string& key) {
  const Field* f = registry().find(key);
  EASYCTX_CHECK_INPUT(f != nullptr, "unknown config key '", key, "'; see docs/config.md");
  return f->get(cfg);
}

void apply_override(StageConfig& cfg, const std::string& assignment) {
  std::string loc = "--set " + assignment;
  size_t eq = assignment.find('=');
  EASYCTX_CHECK_INPUT(eq != std::string::npos && eq > 0, loc, ": expected key=value");
  std::string key = trim(assignment.substr(0, eq));
  std::string text = assignment.substr(eq + 1);
  std::string scalar;
  try {
    YAML::Node n = YAML::Load(text);
    if (n.IsNull()) scalar = "";
    else if (n.IsScalar()) scalar = n.Scalar();
    else EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got '", text, "'");
  } catch (const YAML::Exception& e) {
    EASYCTX_THROW_INPUT(loc, ": ", key, ": cannot parse value '", text.substr(0, 80), text.size() > 80 ? "...'" : "'",
                        ": ", yaml_error_message(e));
  }
  if (registry().find(key) && text.empty())
    EASYCTX_THROW_INPUT(loc, ": ", key, ": missing value: expected ", registry().find(key)->allowed);
  set_field(cfg, key, scalar, loc);
}

StageConfig parse_stage_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  StageConfig cfg;
  cfg.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    EASYCTX_THROW_INPUT(yaml_error_place(source, e), ": invalid YAML: ", yaml_error_message(e));
  }
  if (!root.IsNull()) {
    EASYCTX_CHECK_INPUT(root.IsMap(), source,
                        ": the top level must be a mapping of sections (model:, data:, train:, ...)");
    walk(cfg, root, "", source);
  }
  for (const auto& o : overrides) apply_override(cfg, o);
  resolve_ring_degree(cfg);
  // offload_params, offload_grads and offload_optimizer_layers need the host AdamW: they decide an
  // auto optimizer placement.
  auto& z = cfg.parallel.zero;
  if (z.offload_optimizer_auto && (z.offload_params || z.offload_grads || z.offload_optimizer_layers > 0)) {
    z.offload_optimizer = true;
    z.offload_optimizer_auto = false;
  }
  return cfg;
}

StageConfig load_stage_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> yamls;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.path().extension() == ".yaml" || e.path().extension() == ".yml") yamls.push_back(e.path().filename());
    std::sort(yamls.begin(), yamls.end());
    std::string some;
    for (size_t i = 0; i < yamls.size() && i < 3; ++i) some += (i ? ", " : "") + yamls[i];
    EASYCTX_THROW_INPUT(path, ": is a folder; the stage config is one YAML file",
                        yamls.empty() ? std::string(" (this folder holds none)")
                                      : " (this folder holds " + some + (yamls.size() > 3 ? ", ..." : "") + ")");
  }
  return parse_stage_config(read_file(path), path, overrides);
}

std::string dump_stage_config(const StageConfig& cfg) {
  std::ostringstream os;
  std::vector<std::string> open;  // currently open section path
  for (const auto& f : registry().fields) {
    auto parts = split(f.key, '.');
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      os << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    os << std::string(2 * (parts.size() - 1), ' ') << parts.back() << ": " << f.get(cfg) << "\n";
  }
  return os.str();
}

std::vector<std::pair<std::string, std::string>> training_settings(const StageConfig& cfg, int64_t dp_size) {
  std::vector<std::pair<std::string, std::string>> out;
  bool batch = false;
  for (const Field& f : registry().fields) {
    if (f.role == KeyRole::kTraining) out.emplace_back(f.key, f.get(cfg));
    if (f.role != KeyRole::kGlobalBatch || batch) continue;
    batch = true;
    out.emplace_back("global batch (batch_size x grad_accum x data-parallel)",
                     std::to_string(cfg.train.batch_size * cfg.train.grad_accum * dp_size));
  }
  return out;
}

std::string config_reference_markdown() {
  StageConfig defaults;
  std::ostringstream os;
  os << "# Stage configuration reference\n\n"
     << "Generated by `build/bin/easyctx_train --config-doc` from the key registry in\n"
     << "`lib/core/config_schema.cpp`, where every key is defined; a test keeps this file identical to it.\n\n"
     << "A stage is one YAML file (`easyctx_train STAGE.yaml`). Every key below can also be set on the\n"
     << "command line with `--set key=value` (same validation). Unknown keys, wrong types and values\n"
     << "out of range are errors naming the file, line, key, the bad value and what is allowed.\n"
     << "`--print-config` prints the resolved configuration and the process-group layout.\n\n"
     << "Keys marked \u2020 change what is trained (the model, the data and how it is packed, the optimizer and\n"
     << "its schedule; with train.batch_size and train.grad_accum, their product with the data-parallel size):\n"
     << "`--resume` with another value than the checkpoint's run names them among the changed settings.\n\n"
     << "Coming from EasyContext: its train.py flags (`easyctx_train --batch-size 1 --parallel_mode ...`) set\n"
     << "these keys, and its mode names are accepted as values; the table is in docs/easycontext.md.\n";
  std::string section;
  for (const auto& f : registry().fields) {
    auto parts = split(f.key, '.');
    std::string sec = parts[0];
    if (parts.size() > 2) sec += "." + parts[1];
    if (sec != section) {
      section = sec;
      os << "\n## `" << sec << "`\n\n| key | type | allowed | default | meaning |\n|---|---|---|---|---|\n";
    }
    std::string def = f.get(defaults);
    os << "| `" << f.key << "`" << (f.role == KeyRole::kRun ? "" : " \u2020") << " | " << f.type << " | " << f.allowed
       << " | `" << def << "` | " << f.doc << " |\n";
  }
  return os.str();
}

}  // namespace easyctx
