// Stage configuration: one typed struct per YAML section, defaults here, every key
// registered (type, range, default, documentation) in config_schema_*.cpp; config_schema.cpp
// is the only place that parses and validates. docs/config.md is generated from that registry
// (`easyctx_train --config-doc`) and a test keeps the two identical.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace easyctx {

enum class SeqParallelMode { None, ZigzagRing, Ulysses, DistFlash, Usp };
enum class LrSchedule { Constant, Linear, Cosine };
enum class CheckpointPolicy { None, Layer, AttentionOutput };
enum class OffloadTarget { None, Cpu };
enum class DeviceKind { Auto, Cpu, Cuda };
enum class ZeroGroupScope { World, Node };
enum class NonFinitePolicy { Stop, SkipStep };
enum class DataPacking { Window, BestFit, OnePerWindow };
enum class LongDocuments { Split, Refuse };

const char* to_string(SeqParallelMode m);
const char* to_string(LrSchedule s);
const char* to_string(CheckpointPolicy p);
const char* to_string(OffloadTarget o);
const char* to_string(DeviceKind d);
const char* to_string(ZeroGroupScope z);
const char* to_string(NonFinitePolicy p);

struct ModelConfig {
  std::string config = "tiny";  // preset in configs/models/, a model YAML, or an HF config.json (or its folder)
  std::string init = "random";  // random | hf:DIR | ckpt:DIR
  double rope_theta = 0;        // 0: keep the model's
  double init_std = 0.02;
  bool carry_optimizer = false;  // with init ckpt:DIR, also take its Adam moments
  std::string adapter;           // a PEFT LoRA adapter folder applied to model.init's weights ("": none)
};

struct DataConfig {
  std::string path;                                     // shard file, folder of shards, or glob
  int64_t seq_length = 2048;                            // tokens per training sequence (window of seq_length + 1)
  bool check_tokens = true;                             // scan every window for ids >= vocab
  DataPacking packing = DataPacking::Window;            // how documents fill the windows (docs/data.md)
  LongDocuments long_documents = LongDocuments::Split;  // packed modes: a document longer than seq_length
  bool document_mask = false;  // positions restart per document; micro-batches carry document starts
};

struct TrainConfig {
  int64_t steps = 100;
  uint64_t seed = 42;
  int64_t batch_size = 1;  // sequences per data-parallel rank per micro-step
  int64_t grad_accum = 1;
  double lr = 2e-5;
  double min_lr = 0;
  LrSchedule schedule = LrSchedule::Constant;
  int64_t warmup_steps = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  DeviceKind device = DeviceKind::Auto;
  bool deterministic = false;    // CUDA: true = bit-identical reruns and resumes (slower attention backward)
  bool hopper_attention = true;  // CUDA on sm_90 (H100/H200): easyctx's Hopper attention kernels where routed
  NonFinitePolicy on_nonfinite = NonFinitePolicy::Stop;  // a step whose loss or gradient norm is not finite
};

struct SequenceParallelConfig {
  SeqParallelMode mode = SeqParallelMode::ZigzagRing;  // with size 1: no sequence parallelism
  int64_t size = 1;                                    // ranks per sequence-parallel group
  int64_t ulysses_size = 0;                            // usp: Ulysses degree inside the group (0: ranks per node)
  // EasyContext's --ring_degree (0: not given): usp's ring degree; parsing sets ulysses_size =
  // size / ring_degree from it (the inverse quantity), so the rest of easyctx reads ulysses_size.
  int64_t ring_degree = 0;
};

struct ZeroConfig {
  int64_t stage = 0;  // 0 or 3
  // parallel.zero.offload_optimizer: true (host memory), false (the GPU) or auto (the default):
  // the memory plan keeps the optimizer on the GPU when the run fits there with it, else moves
  // it to host memory (plan::plan_memory; the trainer applies the plan's choice before it
  // allocates). While offload_optimizer_auto is set, offload_optimizer is false until resolved;
  // code that sets offload_optimizer = true needs no change (auto only ever turns it on).
  bool offload_optimizer = false;
  bool offload_optimizer_auto = true;
  // With offload_optimizer (stage 0): only the state of the head and of the last this-many
  // layers in host memory, the embedding's and the other layers' on the GPU (0: every unit's).
  int64_t offload_optimizer_layers = 0;
  bool offload_params = false;
  bool offload_grads = false;
  int64_t prefetch = 1;
  ZeroGroupScope group = ZeroGroupScope::World;
};

struct ParallelConfig {
  SequenceParallelConfig sequence;
  ZeroConfig zero;
  double collective_timeout_s = 600;
};

struct ActivationConfig {
  // activation.checkpoint auto: the memory plan chooses (plan::plan_memory; the trainer applies
  // the choice before it allocates): attention_output in as many of the last layers as fit,
  // with more layer inputs in pinned host memory where that keeps more (activation.offload none
  // only), else layer. Until resolved, checkpoint reads `layer`.
  CheckpointPolicy checkpoint = CheckpointPolicy::Layer;
  bool checkpoint_auto = false;
  OffloadTarget offload = OffloadTarget::None;
  int64_t mlp_tile = 0;                 // tokens per MLP tile (0: untiled)
  int64_t lm_head_tile = 4096;          // tokens per LM-head/cross-entropy tile
  int64_t offload_layers = 0;           // activation.offload cpu: layer inputs moved to the host (0: all, L - 1)
  int64_t attention_head_groups = 1;    // attention in this many passes over head groups
  int64_t attention_output_layers = 0;  // checkpoint attention_output: the last this many layers keep o + LSE (0: all)
};

// LoRA (docs/training.md, "LoRA"): low-rank adapters on the targeted projections, the base
// frozen in the compute dtype. rank 0: off (every weight trained).
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 16;  // scale = alpha / rank (use_rslora: alpha / sqrt(rank))
  bool use_rslora = false;
  std::string targets = "q_proj,k_proj,v_proj,o_proj";  // comma-separated PEFT module names
  std::string trainable;                                // comma-separated: embed_tokens, lm_head, norm
  double dropout = 0;
};

struct OutputConfig {
  std::string dir = "out";
  int64_t save_every = 0;
  int64_t keep_last = 2;
  bool save_final = true;
  bool export_hf = true;
  std::string hf_dtype = "f32";  // f32 | bf16
};

struct LoggingConfig {
  int64_t every = 1;
  bool per_rank = false;
  bool metrics = true;
  bool tensorboard = true;  // <output.dir>/tensorboard/ event files (core/tensorboard.h)
  std::string level = "info";
  bool profile = false;
};

// The machine a run is sized for (lib/plan: `easyctx_train STAGE.yaml --plan`, and the check
// before a run allocates). 0 and "" take the value from the launch and the visible device.
struct TargetConfig {
  std::string gpu;             // "" (the visible device), a known model (plan::known_gpus()) or any name
  double gpu_memory_gib = 0;   // 0: from gpu's name or the device
  int64_t gpus_per_node = 0;   // ranks per node (GPUs, or processes on the CPU backend); 0: the launch's
  int64_t nodes = 0;           // 0: the launch's
  double host_memory_gib = 0;  // per node; 0: MemTotal of this machine (/proc/meminfo)
  double headroom = 0.02;      // share of each GPU's (and host's) memory kept free
};

struct StageConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  ActivationConfig activation;
  LoraConfig lora;
  OutputConfig output;
  LoggingConfig logging;
  TargetConfig target;
  std::string source;  // the YAML file it was loaded from ("" for defaults)
};

// Loads `path` over the defaults, then applies `overrides` ("key=value", YAML scalar syntax)
// in order. Throws InputError naming file:line, key, bad value and what is allowed.
StageConfig load_stage_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Parses YAML text (tests); `source` is the name used in errors.
StageConfig parse_stage_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});
// Applies one "key=value" override.
void apply_override(StageConfig& cfg, const std::string& assignment);
// Cross-key rules that need the world size (divisibility of groups, mode constraints), then
// check_derived_sizes.
void validate_for_world(const StageConfig& cfg, int world_size);
// Sizes derived from several keys fit 64 bits (core/checked.h): tokens per micro-batch,
// the global batch, the run's samples and tokens. InputError naming the keys otherwise.
void check_derived_sizes(const StageConfig& cfg, int world_size);
// Cross-key rules of the activation section (the trainer and the memory plan check them).
void validate_activation(const StageConfig& cfg);
// The lora section's values checked against each other (InputError naming the key); run when a
// config is parsed.
void validate_lora(const StageConfig& cfg);
// The comma-separated names of lora.targets / lora.trainable, trimmed, in order.
std::vector<std::string> lora_names(const std::string& list);
// The resolved config as YAML (loadable again).
std::string dump_stage_config(const StageConfig& cfg);
// Markdown reference of every key (docs/config.md).
std::string config_reference_markdown();
// Every registered key, in order.
std::vector<std::string> config_keys();
// One key's value as YAML scalar text (what --print-config shows); InputError for unknown keys.
std::string config_value(const StageConfig& cfg, const std::string& key);
// What a run trains, as (name, value) in registry order: every key whose value changes it (the
// model, the data and how it is packed and masked, the optimizer and its schedule: the registry
// marks them, docs/config.md shows the mark) and the global batch (batch_size x grad_accum x
// dp_size; how it is split is not a training setting). A resume names those that differ from
// its checkpoint's; their hash is the run's config_hash.
std::vector<std::pair<std::string, std::string>> training_settings(const StageConfig& cfg, int64_t dp_size);

}  // namespace easyctx
