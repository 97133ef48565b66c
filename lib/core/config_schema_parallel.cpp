// The stage-config keys of the parallel (sequence, zero) and activation sections
// (config_schema.cpp's registry() adds them).
#include "core/config_schema_keys.h"

namespace easyctx::config_schema {

using config_registry::KeyRole;
using config_registry::Registry;

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

}  // namespace easyctx::config_schema
