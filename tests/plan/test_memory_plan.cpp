// The memory plan (lib/plan) against what the code allocates: on the CPU backend, whose
// allocations are counted exactly, the planned peak of a real Trainer's steps (and of its
// initialisation) equals the measured one, activation offload included; the knob search
// proposes changes that fit; the target keys are validated; the loader's local length is
// what the plan assumes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/json.h"
#include "core/strings.h"
#include "data/sp_slice.h"
#include "dist/groups.h"
#include "model/param_layout.h"
#include "plan_test_util.h"
#include "train/trainer.h"

namespace easyctx::test {
namespace {

using plan::MemoryPlan;

int64_t phase_alloc(const MemoryPlan& p, const std::string& name) {
  for (const plan::PhaseTotal& ph : p.phases)
    if (ph.name == name) return ph.alloc_bytes;
  ADD_FAILURE() << "no phase " << name;
  return -1;
}

struct Measured {
  int64_t init = 0, peak = 0;
};

// Backend-tracked peak (over every CPU backend of this process, minus what was live
// before) after building the trainer, and after two optimizer steps.
Measured measure(const StageConfig& c) {
  auto world = self_comm("world"), dp = self_comm("dp");
  const int64_t before = ops::cpu_process_memory_stats().live_bytes;
  ops::reset_cpu_process_peak_memory();
  Measured m;
  train::Trainer t(c, *world, *dp);
  m.init = ops::cpu_process_memory_stats().peak_bytes - before;
  t.train_step(0);
  t.train_step(1);
  m.peak = ops::cpu_process_memory_stats().peak_bytes - before;
  return m;
}

class PlanVsMeasured : public ::testing::TestWithParam<std::string> {};

TEST_P(PlanVsMeasured, CpuPeakWithinTwoPercent) {
  TempDir dir("plan-cpu-" + GetParam());
  write_walk_shard(dir / "shard.h5", test_seed(), 60, 200, 700, 512);
  // "<policy>_offload": activation.offload cpu on 5 layers (4 layer inputs and 3 attention
  // outputs leave the ring of two), planned exactly.
  // "..._g<G>": activation.attention_head_groups G (the layer tiled over head groups; G = 4
  // on a model of 4 key/value heads), planned exactly.
  // "lora_...": LoRA on every projection with trainable embeddings and norms (the frozen base's
  // units without gradient or optimizer state), planned exactly.
  const bool lora = GetParam().rfind("lora_", 0) == 0;
  const std::string name = lora ? GetParam().substr(5) : GetParam();
  const size_t gat = name.find("_g");
  const int64_t G = gat == std::string::npos ? 1 : std::stoll(name.substr(gat + 2));
  const std::string param = name.substr(0, gat);
  const bool offload = param.find("_offload") != std::string::npos;
  const bool docs = param.find("_docs") != std::string::npos;  // data.document_mask on packed documents
  const std::string policy = param.substr(0, std::min(param.find("_offload"), param.find("_docs")));
  StageConfig c =
      small_stage(write_small_model(dir.path(), offload ? 5 : 2, G == 4 ? 4 : 2), dir / "shard.h5", dir / "out");
  c.activation.attention_head_groups = G;
  if (docs) {
    write_walk_shard(dir / "docs.h5", test_seed() + 1, 200, 20, 150, 512);
    c.data.path = dir / "docs.h5";
    c.data.packing = DataPacking::BestFit;
    c.data.document_mask = true;
  }
  if (policy == "none") c.activation.checkpoint = CheckpointPolicy::None;
  if (policy == "attention_output") c.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  if (policy == "zero3") c.parallel.zero.stage = 3;
  if (offload) c.activation.offload = OffloadTarget::Cpu;
  if (lora) {
    c.lora.rank = 8;
    c.lora.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    c.lora.trainable = "embed_tokens,norm";
  }
  const MemoryPlan p = plan::plan_memory(c, cpu_target());
  const Measured m = measure(c);
  std::printf("[plan] %s: predicted peak %lld B (%s), measured %lld B; init predicted %lld, measured %lld\n",
              GetParam().c_str(), static_cast<long long>(p.alloc_peak_bytes), p.alloc_peak_phase.c_str(),
              static_cast<long long>(m.peak), static_cast<long long>(phase_alloc(p, "init")),
              static_cast<long long>(m.init));
  EXPECT_LT(rel_diff(p.alloc_peak_bytes, m.peak), 0.02);
  EXPECT_LT(rel_diff(phase_alloc(p, "init"), m.init), 0.02);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.gpu_peak_bytes, 0);                         // nothing on a GPU
  EXPECT_GT(p.host_rank_peak_bytes, p.alloc_peak_bytes);  // host = backend buffers + heap + baseline
  if (G > 1 || docs || lora) {
    EXPECT_EQ(p.alloc_peak_bytes, m.peak);
    EXPECT_EQ(phase_alloc(p, "init"), m.init);
  }
  if (!offload || G > 1) return;
  EXPECT_EQ(p.alloc_peak_bytes, m.peak);
  EXPECT_EQ(phase_alloc(p, "init"), m.init);
  // The offloaded checkpoints are items of their own: n = 2 x 256 tokens, D = Hq hd = 128,
  // 4 heads, 4-byte elements; 4 layer inputs, and with attention_output 3 outputs and LSEs.
  int64_t off = 0;
  for (const plan::PlanItem& i : p.items)
    if (i.name.find("(offloaded)") != std::string::npos) {
      EXPECT_EQ(i.where, "host");
      EXPECT_TRUE(i.tracked);  // the CPU backend's own buffers
      off += i.bytes;
    }
  const int64_t n = 512, resid = 4 * n * 128, o = 4 * n * 128, lse = 4 * 4 * n;
  EXPECT_EQ(off, 4 * resid + (policy == "attention_output" ? 3 * (o + lse) : 0));
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, PlanVsMeasured,
                         ::testing::Values("none", "layer", "attention_output", "zero3", "layer_offload",
                                           "attention_output_offload", "none_g2", "layer_g2", "layer_g4",
                                           "attention_output_g2", "attention_output_g4", "layer_offload_g2",
                                           "attention_output_offload_g4", "zero3_g2", "layer_docs",
                                           "attention_output_docs", "lora_layer", "lora_none", "lora_zero3",
                                           "lora_attention_output_g2", "lora_layer_offload"),
                         [](const auto& info) { return info.param; });

// The plan's per-rank sequence length is the loader's (lib/data is not a dependency of
// lib/plan, which keeps its own copy of the padding rule).
TEST(MemoryPlan, LocalLengthMatchesTheLoader) {
  StageConfig c;
  c.model.config = "tiny";
  struct Case {
    SeqParallelMode mode;
    data::SpLayout layout;
    int sp, world, ulysses;
  };
  const Case cases[] = {{SeqParallelMode::ZigzagRing, data::SpLayout::Zigzag, 2, 2, 0},
                        {SeqParallelMode::ZigzagRing, data::SpLayout::Zigzag, 3, 6, 0},
                        {SeqParallelMode::DistFlash, data::SpLayout::Contiguous, 3, 3, 0},
                        {SeqParallelMode::Ulysses, data::SpLayout::Contiguous, 2, 4, 0},
                        {SeqParallelMode::Usp, data::SpLayout::Usp, 4, 4, 2},
                        {SeqParallelMode::ZigzagRing, data::SpLayout::None, 1, 2, 0}};
  for (const Case& k : cases)
    for (int64_t L : {37, 256, 1000, 4097}) {
      c.parallel.sequence.mode = k.mode;
      c.parallel.sequence.size = k.sp;
      c.parallel.sequence.ulysses_size = k.ulysses;
      c.data.seq_length = L;
      const MemoryPlan p = plan::plan_memory(c, cpu_target(k.world));
      EXPECT_EQ(p.local_len, data::sp_local_length(L, k.layout, k.sp, std::max(1, k.ulysses)))
          << to_string(k.mode) << " sp " << k.sp << " L " << L;
      EXPECT_EQ(p.sp, k.sp);
      EXPECT_EQ(p.dp, k.world / k.sp);
    }
}

// The host buffers of MpiComm's rank-ordered gradient sums (CPU data parallelism): the
// largest unit (a layer of the tiny preset) in blocks over the G ranks.
TEST(MemoryPlan, CpuGradientReductionBuffers) {
  StageConfig c;
  c.model.config = "tiny";
  const MemoryPlan one = plan::plan_memory(c, cpu_target(1));
  const MemoryPlan three = plan::plan_memory(c, cpu_target(3));
  auto reduce = [](const MemoryPlan& p) {
    for (const plan::PlanItem& i : p.items)
      if (i.phase == "gradient reduce") return i.bytes;
    return int64_t{0};
  };
  EXPECT_EQ(reduce(one), 0);  // nothing to sum on one rank
  int64_t unit = 0;
  const model::ParamLayout layout(model::load_llama_config("tiny"));
  for (const model::ParamUnit& u : layout.units()) unit = std::max(unit, u.numel);
  EXPECT_EQ(unit, 64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 172 + 2 * 64);  // q, o, k, v, MLP, norms
  const int64_t block = (unit + 2) / 3;
  EXPECT_EQ(reduce(three), 4 * (2 * block * 3 + block));
}

// ---- the knob search: a target too small for the run gets single changes that fit.
StageConfig big_run() {
  StageConfig c;
  c.model.config = "llama2-7b";
  c.data.seq_length = 262144;
  c.train.device = DeviceKind::Cuda;
  c.activation.checkpoint = CheckpointPolicy::Layer;
  c.parallel.zero.offload_optimizer_auto = false;  // these tests plan the placement they set
  return c;
}

// One H200 as CUDA reports it (totalGlobalMem; nvidia-smi says 143,771 MiB).
constexpr double kH200Gib = 150109880320.0 / (1 << 30);

plan::PlanTarget gpu_target(double gib, int gpus = 1, int nodes = 1) {
  plan::PlanTarget t;
  t.backend = DeviceKind::Cuda;
  t.gpu_name = "test GPU";
  t.gpu_memory_bytes = static_cast<int64_t>(gib * (1 << 30));
  t.gpus_per_node = gpus;
  t.nodes = nodes;
  t.host_memory_bytes = int64_t{2048} << 30;
  return t;
}

// configs/bench/llama2-7b-1gpu.yaml with `sets` (bench_config), planned as its runs on the bench
// machine plan (plan_bench): one GPU of `gib` GiB (the H200's), a 128 GiB host, the config's
// headroom (2%); plan_bench of a config takes one changed after loading (an auto choice written in).
StageConfig bench_config(const std::vector<std::string>& sets) {
  return load_stage_config(source_dir() + "/configs/bench/llama2-7b-1gpu.yaml", sets);
}
MemoryPlan plan_bench(const StageConfig& c, double gib = kH200Gib) {
  plan::PlanTarget t = gpu_target(gib);
  t.gpu_name = "NVIDIA H200";
  t.host_memory_bytes = int64_t{128} << 30;
  t.headroom = c.target.headroom;
  return plan::plan_memory(c, t);
}
MemoryPlan plan_bench(const std::vector<std::string>& sets, double gib = kH200Gib) {
  return plan_bench(bench_config(sets), gib);
}

// GPU memory (GiB, for gpu_target) halfway between two plans' GPU peaks, headroom included:
// the larger plan does not fit such a GPU, the smaller does.
double gib_between(const MemoryPlan& a, const MemoryPlan& b) {
  return 0.5 * static_cast<double>(a.gpu_peak_bytes + b.gpu_peak_bytes) / (1 << 30) / (1 - a.target.headroom);
}

// On 8 GPUs per node between the peaks of `without` and `with` (which differ by `knob`; their
// plans on 8 roomy GPUs given): `without` is refused with `knob` among its fixes, `with` fits.
void expect_refusal_names_knob(const StageConfig& without, const MemoryPlan& p_without, const StageConfig& with,
                               const MemoryPlan& p_with, const std::string& knob) {
  const double gib = gib_between(p_without, p_with);
  const MemoryPlan tight = plan::plan_memory(without, gpu_target(gib, 8));
  ASSERT_FALSE(tight.fits) << knob;
  bool named = false;
  for (const plan::KnobFix& k : tight.knobs) named |= k.assignment == knob;
  EXPECT_TRUE(named) << plan::refusal_message(tight);
  EXPECT_TRUE(plan::plan_memory(with, gpu_target(gib, 8)).fits) << knob;
}

TEST(MemoryPlan, KnobSearchProposesChangesThatFit) {
  const StageConfig c = big_run();
  const MemoryPlan fits = plan::plan_memory(c, gpu_target(2000));
  ASSERT_TRUE(fits.fits);
  EXPECT_TRUE(fits.knobs.empty());
  // A GPU 10% smaller than the run needs.
  const double need = static_cast<double>(fits.gpu_peak_bytes) / (1 << 30) / (1 - fits.target.headroom);
  const MemoryPlan p = plan::plan_memory(c, gpu_target(0.9 * need));
  ASSERT_FALSE(p.fits);
  ASSERT_FALSE(p.knobs.empty());
  const std::string msg = plan::refusal_message(p);
  EXPECT_NE(msg.find("does not fit: predicted"), std::string::npos) << msg;
  bool offload = false, tile = false;
  for (const plan::KnobFix& k : p.knobs) {
    EXPECT_NE(msg.find(k.to_string()), std::string::npos) << msg;
    StageConfig fixed = c;
    for (const std::string& a : split(k.assignment, ' ')) apply_override(fixed, a);
    plan::PlanTarget t = gpu_target(0.9 * need);
    t.nodes = k.nodes;
    t.gpus_per_node = k.gpus_per_node;
    const MemoryPlan q = plan::plan_memory(fixed, t);
    EXPECT_TRUE(q.fits) << k.assignment;
    EXPECT_EQ(q.gpu_peak_bytes, k.gpu_bytes) << k.assignment;
    offload |= k.assignment == "parallel.zero.offload_optimizer=true";
    if (k.assignment.rfind("activation.mlp_tile=", 0) == 0) {
      tile = true;  // the largest tile that fits: twice that does not
      StageConfig bigger = c;
      apply_override(bigger, "activation.mlp_tile=" + std::to_string(2 * fixed.activation.mlp_tile));
      EXPECT_FALSE(plan::plan_memory(bigger, t).fits) << k.assignment;
    }
  }
  EXPECT_TRUE(offload) << msg;  // the optimizer state alone is 12 of the ~16 bytes per parameter
  EXPECT_TRUE(tile) << msg;
  std::printf("[plan] %s\n", msg.c_str());
}

// parallel.zero.offload_optimizer auto (the default): the plan keeps the optimizer on the GPU
// when the run fits there with it; when not, it keeps it there still if moving the fewest layer
// inputs to pinned host memory makes room (activation.offload none only), else it moves the
// optimizer to host memory. Each way the plan equals the one of the explicit settings it chose
// and says which in a note. The bench's 7B on one H200: 32K fits with the optimizer on the GPU
// (1.13x the peer that way, 0.75x with it in host memory: bench/RESULTS.md session 24); 64K fits
// with 12 layer inputs in host memory (measured 4,536 tok/s, 1.10x the peer, against 1.03x with
// the optimizer in host memory, session 26); with the user's own activation offload, or on an
// 80 GB GPU, the state of the fewest last layers (with the head's) goes to host memory (the
// split); on a GPU too small for any layer's state beside the run all of it.
TEST(MemoryPlan, OptimizerAutoPicksTheGpuWhenItFits) {
  const auto plan_of = [](int64_t seq, const std::string& opt, std::vector<std::string> extra = {},
                          double gib = kH200Gib) {
    extra.push_back("data.seq_length=" + std::to_string(seq));
    extra.push_back("parallel.zero.offload_optimizer=" + opt);
    return plan_bench(extra, gib);
  };
  const auto note_of = [](const MemoryPlan& p) {
    for (const std::string& n : p.notes)
      if (n.rfind("parallel.zero.offload_optimizer auto", 0) == 0) return n;
    return std::string();
  };
  const auto same = [](const MemoryPlan& a, const MemoryPlan& b) {
    EXPECT_EQ(a.gpu_peak_bytes, b.gpu_peak_bytes);
    EXPECT_EQ(a.host_peak_bytes, b.host_peak_bytes);
    EXPECT_EQ(a.settings.dump(), b.settings.dump());
    EXPECT_EQ(a.offload_optimizer, b.offload_optimizer);
  };
  // 32K: on the GPU as it is.
  {
    const MemoryPlan a = plan_of(32768, "auto"), g = plan_of(32768, "false");
    ASSERT_TRUE(g.fits);
    same(a, g);
    EXPECT_EQ(a.auto_offload_layers, 0);
    EXPECT_NE(note_of(a).find("on the GPU (the run fits with it"), std::string::npos) << note_of(a);
    EXPECT_EQ(note_of(g), "");
  }
  // 64K: on the GPU with the fewest layer inputs in host memory that fit, each fewer does not.
  {
    const MemoryPlan a = plan_of(65536, "auto"), g = plan_of(65536, "false"), h = plan_of(65536, "true");
    std::printf("[auto] 7B 64K: optimizer on the GPU %.2f GiB (fits %d), in host memory %.2f GiB; auto: %s\n",
                g.gpu_peak_bytes / 1073741824.0, g.gpu_fits, h.gpu_peak_bytes / 1073741824.0, note_of(a).c_str());
    ASSERT_FALSE(g.gpu_fits);
    ASSERT_TRUE(h.fits);
    const int64_t k = a.auto_offload_layers;
    EXPECT_EQ(k, 12);  // what the run on the H200 chose (bench/RESULTS.md session 26)
    ASSERT_GT(k, 0);
    ASSERT_LT(k, 31);
    const auto offloading = [&](int64_t n) {
      return plan_of(65536, "false", {"activation.offload=cpu", "activation.offload_layers=" + std::to_string(n)});
    };
    const MemoryPlan with_k = offloading(k), with_fewer = offloading(k - 1);
    EXPECT_TRUE(with_k.fits);
    EXPECT_FALSE(with_fewer.gpu_fits);
    same(a, with_k);
    // What the trainer runs: the placement written into the config, planned again.
    StageConfig placed = bench_config({"data.seq_length=65536"});
    plan::apply_placement(placed, plan::placement_of(a));
    EXPECT_EQ(placed.activation.offload, OffloadTarget::Cpu);
    EXPECT_EQ(placed.activation.offload_layers, k);
    EXPECT_FALSE(placed.parallel.zero.offload_optimizer_auto);
    same(a, plan_bench(placed));
    EXPECT_FALSE(a.offload_optimizer);
    EXPECT_NE(note_of(a).find("on the GPU, with the inputs of the first " + std::to_string(k) + " layers"),
              std::string::npos)
        << note_of(a);
    // The host bytes of the middle way are the layer inputs', far below the optimizer's.
    EXPECT_LT(a.host_peak_bytes, h.host_peak_bytes / 4);
    // A set activation offload is the user's: auto then moves no more layer inputs, it splits
    // the optimizer (the state of the last 2 layers and the head in host memory).
    const MemoryPlan u = plan_of(65536, "auto", {"activation.offload=cpu", "activation.offload_layers=2"});
    EXPECT_TRUE(u.offload_optimizer);
    EXPECT_EQ(u.auto_offload_layers, 0);
    EXPECT_EQ(u.offload_optimizer_layers, 2);
    EXPECT_NE(note_of(u).find("split"), std::string::npos) << note_of(u);
    // A GPU that cannot hold the optimizer with every layer input moved out (80 GB): the split,
    // the state of the fewest last layers (and the head's) in host memory; more than half of
    // them there, so layer inputs go to pinned host memory to make room for more: the fewest
    // that give the fewest host layers. One host layer fewer does not fit even with every input
    // moved out; one input fewer does not fit the host layers chosen.
    const MemoryPlan small = plan_of(65536, "auto", {}, 80.0);
    const int64_t host_layers = small.offload_optimizer_layers, inputs = small.auto_offload_layers;
    std::printf("[auto] 7B 64K on 80 GB: %s\n", note_of(small).c_str());
    EXPECT_TRUE(small.offload_optimizer);
    ASSERT_GT(host_layers, 0);
    ASSERT_LT(host_layers, 32);
    ASSERT_GT(inputs, 0);
    EXPECT_NE(note_of(small).find("split"), std::string::npos) << note_of(small);
    const auto split = [&](int64_t n, int64_t j) {
      return plan_of(65536, "true",
                     {"parallel.zero.offload_optimizer_layers=" + std::to_string(n), "activation.offload=cpu",
                      "activation.offload_layers=" + std::to_string(j)},
                     80.0);
    };
    same(small, split(host_layers, inputs));
    EXPECT_FALSE(split(host_layers - 1, 31).gpu_fits);
    EXPECT_FALSE(split(host_layers, inputs - 1).gpu_fits);
    EXPECT_EQ(plan::placement_of(small), "host " + std::to_string(host_layers) + " " + std::to_string(inputs));
    // Where no layer's state fits beside the run (64 GB): host memory.
    const MemoryPlan tiny = plan_of(65536, "auto", {}, 64.0), tiny_h = plan_of(65536, "true", {}, 64.0);
    same(tiny, tiny_h);
    EXPECT_EQ(tiny.offload_optimizer_layers, 0);
    EXPECT_NE(note_of(tiny).find("in host memory"), std::string::npos) << note_of(tiny);
  }
  // Not a CUDA run: nothing to choose, no note.
  StageConfig c = big_run();
  c.parallel.zero.offload_optimizer_auto = true;
  c.train.device = DeviceKind::Cpu;
  c.model.config = "tiny";
  c.data.seq_length = 256;
  const MemoryPlan p = plan::plan_memory(c, cpu_target());
  EXPECT_FALSE(p.offload_optimizer);
  EXPECT_EQ(note_of(p), "");
}

// The placement all ranks take from their plans' (the trainer's reduce over the ranks): host
// memory when any rank needs it, else the GPU with the most layer inputs any rank moved out.
TEST(MemoryPlan, RanksAgreeOnTheOptimizerPlacement) {
  EXPECT_EQ(plan::agree_placement({"gpu 0"}), "gpu 0");
  EXPECT_EQ(plan::agree_placement({"gpu 0", "gpu 3", "gpu 12", "gpu 7"}), "gpu 12");
  EXPECT_EQ(plan::agree_placement({"gpu 0", "host", "gpu 12"}), "host");
  EXPECT_EQ(plan::agree_placement({"host", "host"}), "host");
  EXPECT_EQ(plan::placement_offload_layers("gpu 12"), 12);
  EXPECT_EQ(plan::placement_offload_layers("host"), 0);
  // Splits: the most layers in host memory any rank needs; host memory over all of them.
  EXPECT_EQ(plan::agree_placement({"gpu 3", "host 4", "host 6", "gpu 0"}), "host 6 3");
  EXPECT_EQ(plan::agree_placement({"host 4 9", "host 6"}), "host 6 9");
  EXPECT_EQ(plan::placement_offload_layers("host 6 9"), 9);
  EXPECT_EQ(plan::placement_optimizer_layers("host 6 9"), 6);
  EXPECT_EQ(plan::agree_placement({"host 2", "host", "host 9"}), "host");
  EXPECT_EQ(plan::placement_optimizer_layers("host 6"), 6);
  EXPECT_EQ(plan::placement_optimizer_layers("host"), 0);
  EXPECT_EQ(plan::placement_optimizer_layers("gpu 4"), 0);
  EXPECT_EQ(plan::placement_offload_layers("host 6"), 0);
  for (const std::string bad : {"", "gpu", "gpu ", "gpu -1", "gpu 1x", "cpu 2", "Host", "host 0", "host -2", "host x",
                                "host  3", "host 3 0", "host 3 4 5", "gpu 1 2"})
    EXPECT_THROW(plan::agree_placement({"gpu 1", bad}), Error) << "'" << bad << "'";
  MemoryPlan p;
  p.auto_offload_layers = 5;
  EXPECT_EQ(plan::placement_of(p), "gpu 5");
  p.offload_optimizer = true;
  p.auto_offload_layers = 0;
  EXPECT_EQ(plan::placement_of(p), "host");
  p.offload_optimizer_layers = 7;
  EXPECT_EQ(plan::placement_of(p), "host 7");
  p.auto_offload_layers = 3;
  EXPECT_EQ(plan::placement_of(p), "host 7 3");
  StageConfig c;
  plan::apply_placement(c, "host 7 3");
  EXPECT_EQ(c.activation.offload, OffloadTarget::Cpu);
  EXPECT_EQ(c.activation.offload_layers, 3);
  c = StageConfig();
  plan::apply_placement(c, "host 7");
  EXPECT_TRUE(c.parallel.zero.offload_optimizer);
  EXPECT_FALSE(c.parallel.zero.offload_optimizer_auto);
  EXPECT_EQ(c.parallel.zero.offload_optimizer_layers, 7);
  EXPECT_EQ(c.activation.offload, OffloadTarget::None);
  plan::apply_placement(c, "gpu 2");
  EXPECT_FALSE(c.parallel.zero.offload_optimizer);
  EXPECT_EQ(c.parallel.zero.offload_optimizer_layers, 0);
}

// parallel.zero.offload_optimizer auto between "the GPU" and "host memory": the split. qwen2.5-7b
// at 32K on one H200 (the bench's config: whole-layer recompute) does not fit with the whole
// optimizer on the GPU, nor with every layer input moved out; the plan keeps the state of the
// embedding and the first layers on the GPU and moves that of the fewest last layers (with the
// head's) to host memory: one layer fewer does not fit. The trainer's config (the placement
// applied) plans the same; its host memory is a fraction of the whole optimizer's.
TEST(MemoryPlan, OptimizerAutoSplitsWhatTheGpuCannotHold) {
  const auto plan_of = [](const std::string& model, int64_t seq, std::vector<std::string> extra, double gib) {
    extra.push_back("model.config=" + model);
    extra.push_back("data.seq_length=" + std::to_string(seq));
    return plan_bench(extra, gib);
  };
  const MemoryPlan a = plan_of("qwen2.5-7b", 32768, {}, kH200Gib);
  const MemoryPlan h = plan_of("qwen2.5-7b", 32768, {"parallel.zero.offload_optimizer=true"}, kH200Gib);
  ASSERT_TRUE(a.fits) << plan::refusal_message(a);
  const int64_t k = a.offload_optimizer_layers;
  std::string note;
  for (const std::string& n : a.notes)
    if (n.rfind("parallel.zero.offload_optimizer auto", 0) == 0) note = n;
  std::printf("[split] qwen2.5-7b 32K H200: %s; GPU %.2f GiB, host %.2f GiB (all in host memory: %.2f / %.2f)\n",
              note.c_str(), a.gpu_peak_bytes / 1073741824.0, a.host_peak_bytes / 1073741824.0,
              h.gpu_peak_bytes / 1073741824.0, h.host_peak_bytes / 1073741824.0);
  EXPECT_TRUE(a.offload_optimizer);
  ASSERT_GT(k, 0);
  ASSERT_LT(k, 28);
  EXPECT_EQ(plan::placement_of(a), "host " + std::to_string(k));
  EXPECT_NE(note.find("split"), std::string::npos) << note;
  const auto split = [&](int64_t n) {
    return plan_of(
        "qwen2.5-7b", 32768,
        {"parallel.zero.offload_optimizer=true", "parallel.zero.offload_optimizer_layers=" + std::to_string(n)},
        kH200Gib);
  };
  EXPECT_TRUE(split(k).fits);
  EXPECT_FALSE(split(k - 1).gpu_fits);
  EXPECT_LT(a.host_peak_bytes, h.host_peak_bytes / 2);
  EXPECT_GT(a.gpu_peak_bytes, h.gpu_peak_bytes);
  StageConfig placed = bench_config({"model.config=qwen2.5-7b", "data.seq_length=32768"});
  plan::apply_placement(placed, plan::placement_of(a));
  const MemoryPlan again = plan_bench(placed);
  EXPECT_EQ(again.gpu_peak_bytes, a.gpu_peak_bytes);
  EXPECT_EQ(again.host_peak_bytes, a.host_peak_bytes);
  // The 3-4B presets fit whole on one H200 at 32K: no split.
  for (const char* m : {"qwen3-4b", "qwen2.5-3b", "llama3.2-3b"}) {
    const MemoryPlan s = plan_of(m, 32768, {}, kH200Gib);
    EXPECT_FALSE(s.offload_optimizer) << m;
  }
  // The 8Bs at 32K on an 80 GB H100: what the plan keeps on the GPU there (printed).
  for (const char* m : {"llama3-8b", "qwen2.5-7b", "qwen3-8b"}) {
    const MemoryPlan s = plan_of(m, 32768, {}, 80.0);
    std::printf("[split] %s 32K H100: %s, GPU %.2f GiB, host %.2f GiB\n", m, plan::placement_of(s).c_str(),
                s.gpu_peak_bytes / 1073741824.0, s.host_peak_bytes / 1073741824.0);
    EXPECT_TRUE(s.fits) << m;
  }
}

// With the optimizer offloaded, the ZeRO-3 suggestion keeps the offload (each rank's optimizer
// shards in host memory): the suggested config fits, and its host
// memory per node is smaller than stage 0's (each rank holds 1/Z of the optimizer state).
TEST(MemoryPlan, ZeroThreeKnobKeepsOptimizerOffload) {
  StageConfig c = big_run();
  c.data.seq_length = 32768;
  c.parallel.zero.offload_optimizer = true;
  StageConfig z = c;
  z.parallel.zero.stage = 3;
  const MemoryPlan p0 = plan::plan_memory(c, gpu_target(2000, 8)), p3 = plan::plan_memory(z, gpu_target(2000, 8));
  ASSERT_LT(p3.gpu_peak_bytes, p0.gpu_peak_bytes);
  const double gib = gib_between(p0, p3);
  const MemoryPlan p = plan::plan_memory(c, gpu_target(gib, 8));
  ASSERT_FALSE(p.fits);
  const plan::KnobFix* k3 = nullptr;
  for (const plan::KnobFix& k : p.knobs)
    if (k.assignment.rfind("parallel.zero.stage=3", 0) == 0) k3 = &k;
  ASSERT_NE(k3, nullptr) << plan::refusal_message(p);
  EXPECT_EQ(k3->assignment, "parallel.zero.stage=3");
  EXPECT_LT(p3.host_peak_bytes, p0.host_peak_bytes);
  StageConfig fixed = c;
  for (const std::string& a : split(k3->assignment, ' ')) apply_override(fixed, a);
  const MemoryPlan q = plan::plan_memory(fixed, gpu_target(gib, 8));
  EXPECT_TRUE(q.fits);
}

// llama2-7b at 256K tokens on one H200: no single knob that keeps the problem fits, so a
// combination is searched, each of its knobs relaxed to the least drastic value that fits.
TEST(MemoryPlan, CombinationWhenNoSingleKnobFits) {
  const MemoryPlan p = plan::plan_memory(big_run(), gpu_target(kH200Gib));
  ASSERT_FALSE(p.fits);
  const plan::KnobFix* combo = nullptr;
  for (const plan::KnobFix& k : p.knobs)
    if (k.note == "together") combo = &k;
  ASSERT_NE(combo, nullptr) << plan::refusal_message(p);
  const std::vector<std::string> sets = split(combo->assignment, ' ');
  ASSERT_GE(sets.size(), 2u) << combo->assignment;
  StageConfig fixed = big_run();
  for (const std::string& a : sets) apply_override(fixed, a);
  EXPECT_TRUE(plan::plan_memory(fixed, gpu_target(kH200Gib)).fits) << combo->assignment;
  // Each knob is needed: without any one of them it does not fit (activation.offload_layers
  // belongs to the activation.offload knob before it).
  std::vector<std::vector<std::string>> knobs;
  for (const std::string& a : sets) {
    if (a.rfind("activation.offload_layers=", 0) == 0 && !knobs.empty()) knobs.back().push_back(a);
    else knobs.push_back({a});
  }
  for (size_t drop = 0; drop < knobs.size(); ++drop) {
    StageConfig partial = big_run();
    for (size_t i = 0; i < knobs.size(); ++i)
      if (i != drop)
        for (const std::string& a : knobs[i]) apply_override(partial, a);
    EXPECT_FALSE(plan::plan_memory(partial, gpu_target(kH200Gib)).fits) << "without " << knobs[drop][0];
  }
  std::printf("[plan] %s\n", plan::refusal_message(p).c_str());
}

TEST(MemoryPlan, NothingFitsSaysSo) {
  const MemoryPlan p = plan::plan_memory(big_run(), gpu_target(1));
  ASSERT_FALSE(p.fits);
  EXPECT_TRUE(p.knobs.empty());
  EXPECT_NE(plan::refusal_message(p).find("Nothing makes it fit"), std::string::npos);
}

TEST(MemoryPlan, SequenceParallelKnobAsksForMoreGpus) {
  StageConfig c = big_run();
  c.data.seq_length = 1 << 21;  // 2M tokens on one GPU: only splitting the sequence helps
  const MemoryPlan p = plan::plan_memory(c, gpu_target(139));
  ASSERT_FALSE(p.fits);
  bool sp = false;
  for (const plan::KnobFix& k : p.knobs)
    if (k.assignment.rfind("parallel.sequence.size=", 0) == 0) {
      sp = true;
      EXPECT_NE(k.note.find("needs"), std::string::npos) << k.note;
      const int size = std::stoi(k.assignment.substr(std::string("parallel.sequence.size=").size()));
      EXPECT_EQ(k.nodes * k.gpus_per_node, size);
      StageConfig fixed = c;
      apply_override(fixed, k.assignment);
      EXPECT_TRUE(plan::plan_memory(fixed, gpu_target(139, k.gpus_per_node, k.nodes)).fits) << k.assignment;
      // The GPUs alone do not help, and half the size does not fit.
      EXPECT_FALSE(plan::plan_memory(c, gpu_target(139, k.gpus_per_node, k.nodes)).fits);
      fixed.parallel.sequence.size /= 2;
      EXPECT_FALSE(plan::plan_memory(fixed, gpu_target(139, k.gpus_per_node, k.nodes)).fits);
    }
  EXPECT_TRUE(sp) << plan::refusal_message(p);
}

// Offloading the optimizer moves 12 P bytes from each GPU to the host.
TEST(MemoryPlan, OffloadOptimizerMovesStateToTheHost) {
  StageConfig c = big_run();
  const MemoryPlan a = plan::plan_memory(c, gpu_target(2000));
  c.parallel.zero.offload_optimizer = true;
  const MemoryPlan b = plan::plan_memory(c, gpu_target(2000));
  EXPECT_EQ(a.gpu_peak_bytes - b.gpu_peak_bytes, 12 * a.parameters);
  bool pinned = false;
  for (const plan::PlanItem& i : b.items) pinned |= i.where == "host" && i.bytes == 2 * plan::kOffloadChunkElems * 6;
  EXPECT_TRUE(pinned);
}

// activation.offload cpu: of the L + 1 residual-stream buffers the GPU keeps a ring of two,
// the inputs of layers 0..L-2 go to pinned host memory (the last layer's input stays: the
// backward starts with it); with attention_output also the outputs and LSE of layers 0..L-3.
TEST(MemoryPlan, ActivationOffloadMovesCheckpointsToPinnedHostMemory) {
  for (const CheckpointPolicy policy : {CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput}) {
    StageConfig c = big_run();
    c.activation.checkpoint = policy;
    const MemoryPlan on = plan::plan_memory(c, gpu_target(2000));
    c.activation.offload = OffloadTarget::Cpu;
    const MemoryPlan off = plan::plan_memory(c, gpu_target(2000));
    const int64_t n = 262144, resid = n * 4096 * 2, saved = n * 4096 * 2 + 4 * 32 * n;  // bf16; f32 LSE
    const int64_t moved = 31 * resid + (policy == CheckpointPolicy::AttentionOutput ? 30 * saved : 0);
    EXPECT_EQ(on.alloc_peak_bytes - off.alloc_peak_bytes, moved) << to_string(policy);
    int64_t pinned = 0;
    for (const plan::PlanItem& i : off.items)
      if (i.name.find("(offloaded, pinned)") != std::string::npos) {
        EXPECT_EQ(i.where, "host");
        EXPECT_FALSE(i.tracked);  // host memory: not in the CUDA backend's device counters
        pinned += i.bytes;
      }
    EXPECT_EQ(pinned, moved) << to_string(policy);
  }
  // Refused with checkpoint none (nothing is checkpointed), naming both keys.
  StageConfig none = big_run();
  none.activation.checkpoint = CheckpointPolicy::None;
  none.activation.offload = OffloadTarget::Cpu;
  try {
    plan::plan_memory(none, gpu_target(2000));
    ADD_FAILURE() << "offload with checkpoint none was planned";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activation.offload: cpu needs activation.checkpoint layer or attention_output"),
              std::string::npos)
        << m;
  }
}

// ZeRO-3 on GPUs (per-layer gathering) is smaller per GPU than stage 0.
TEST(MemoryPlan, ZeroThreeIsSmallerPerGpuThanStage0) {
  const MemoryPlan p0 = plan::plan_memory(big_run(), gpu_target(2000, 8));
  StageConfig z = big_run();
  z.parallel.zero.stage = 3;
  const MemoryPlan p3 = plan::plan_memory(z, gpu_target(2000, 8));
  EXPECT_LT(p3.gpu_peak_bytes, p0.gpu_peak_bytes);
}

const plan::PlanItem* plan_item(const MemoryPlan& p, const std::string& name) {
  for (const plan::PlanItem& i : p.items)
    if (i.name == name) return &i;
  return nullptr;
}

// LoRA on a GPU: the frozen base is 2 bytes per parameter (bf16), with no master weights,
// gradients or Adam moments: against the full fine-tune the persistent state falls by 16 bytes
// per frozen parameter (18 - 2), and the plan's note says so; ZeRO-3 shards the frozen base.
TEST(MemoryPlan, LoraFreezesTheBaseInBf16) {
  StageConfig full = big_run();
  full.data.seq_length = 8192;
  StageConfig lora = full;
  lora.lora.rank = 16;
  lora.lora.trainable = "norm";
  const MemoryPlan pf = plan::plan_memory(full, gpu_target(2000)), pl = plan::plan_memory(lora, gpu_target(2000));
  const model::ParamLayout layout(model::resolve_llama_config(lora.model), model::lora_spec(lora.lora));
  const plan::PlanItem* base = plan_item(pl, "bf16 frozen base (LoRA)");
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(base->bytes, 2 * layout.frozen_numel());
  EXPECT_EQ(pl.trainable_parameters, layout.trainable_numel());
  const plan::PlanItem* master = plan_item(pl, "fp32 master weights");
  ASSERT_NE(master, nullptr);
  EXPECT_EQ(master->bytes, 4 * layout.trainable_numel());
  const int64_t frozen = layout.frozen_numel(), full_state = 18 * pf.parameters;
  EXPECT_LT(pl.alloc_peak_bytes, pf.alloc_peak_bytes - 16 * frozen + 18 * layout.trainable_numel());
  EXPECT_GT(pf.alloc_peak_bytes - pl.alloc_peak_bytes, full_state - 2 * frozen - 18 * layout.trainable_numel() -
                                                           (int64_t{1} << 30));  // (the workspace differs a little)
  bool noted = false;
  for (const std::string& n : pl.notes) noted |= n.find("lora: rank 16") != std::string::npos;
  EXPECT_TRUE(noted);
  StageConfig z = lora;
  z.parallel.zero.stage = 3;
  const MemoryPlan pz = plan::plan_memory(z, gpu_target(2000, 8));
  const plan::PlanItem* shard = plan_item(pz, "bf16 frozen base shard (LoRA)");
  ASSERT_NE(shard, nullptr);
  EXPECT_LT(shard->bytes, base->bytes / 7);
}

// LoRA with the optimizer split (parallel.zero.offload_optimizer_layers k): only the trainable
// units have optimizer state, placed by layer as the store places them: the embedding's copy and
// the first layers' adapters and norms on the GPU, the last k layers' and the head's copies in
// host memory; the frozen base stays bf16 on the GPU with no state anywhere. The recorded bytes
// are the store's (the plan replays its allocations), so this checks ParamStore::state_in_host.
TEST(MemoryPlan, LoraSplitsOnlyTheTrainableState) {
  StageConfig c = big_run();
  c.data.seq_length = 8192;
  c.lora.rank = 16;
  c.lora.trainable = "embed_tokens,norm,lm_head";
  c.parallel.zero.offload_optimizer = true;
  c.parallel.zero.offload_optimizer_layers = 5;
  const MemoryPlan p = plan::plan_memory(c, gpu_target(2000));
  const model::ParamLayout layout(model::resolve_llama_config(c.model), model::lora_spec(c.lora));
  const int64_t L = layout.num_layers();
  int64_t host = 0, gpu = 0;
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const model::ParamUnit& unit = layout.units()[u];
    const int64_t at = unit.name == "lora.embed" ? -1 : unit.name == "lora.head" ? L : -2;
    if (at != -2) EXPECT_EQ(layout.unit_layer(u), at) << unit.name;
    if (!unit.frozen) (layout.unit_layer(u) >= L - 5 ? host : gpu) += unit.numel;
  }
  EXPECT_EQ(layout.unit_layer(layout.lora_unit(3)), 3);
  EXPECT_EQ(layout.unit_layer(layout.layer_unit(3)), 3);
  ASSERT_GT(host, 0);
  ASSERT_GT(gpu, host);
  EXPECT_EQ(p.offload_optimizer_layers, 5);
  const plan::PlanItem* dev = plan_item(p, "fp32 master weights");
  const plan::PlanItem* off = plan_item(p, "fp32 master weights (offloaded, pageable)");
  ASSERT_NE(dev, nullptr);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(dev->where, "gpu");
  EXPECT_EQ(off->where, "host");
  EXPECT_EQ(dev->bytes, 4 * gpu);
  EXPECT_EQ(off->bytes, 4 * host);
  const plan::PlanItem* base = plan_item(p, "bf16 frozen base (LoRA)");
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(base->bytes, 2 * layout.frozen_numel());
  // The whole state in host memory (k = 0): every trainable unit's, none of the base's.
  c.parallel.zero.offload_optimizer_layers = 0;
  const MemoryPlan h = plan::plan_memory(c, gpu_target(2000));
  ASSERT_NE(plan_item(h, "fp32 master weights (offloaded, pageable)"), nullptr);
  EXPECT_EQ(plan_item(h, "fp32 master weights (offloaded, pageable)")->bytes, 4 * layout.trainable_numel());
  EXPECT_EQ(plan_item(h, "fp32 master weights"), nullptr);
}

// ZeRO-3 with the optimizer offloaded: the master and Adam shards move from each GPU to its
// host (the same bytes) and the pinned staging joins them.
TEST(MemoryPlan, ZeroThreeWithOptimizerOffload) {
  StageConfig z = big_run();
  z.parallel.zero.stage = 3;
  StageConfig zo = z;
  zo.parallel.zero.offload_optimizer = true;
  const MemoryPlan p3 = plan::plan_memory(z, gpu_target(2000, 8)), po = plan::plan_memory(zo, gpu_target(2000, 8));
  const plan::PlanItem* dev = plan_item(p3, "fp32 master shard + Adam m, v shards");
  const plan::PlanItem* host = plan_item(po, "fp32 master shard + Adam m, v shards (offloaded, pageable)");
  ASSERT_NE(dev, nullptr);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(dev->where, "gpu");
  EXPECT_EQ(host->where, "host");
  EXPECT_EQ(host->bytes, dev->bytes);
  EXPECT_EQ(plan_item(po, "fp32 master shard + Adam m, v shards"), nullptr);
  EXPECT_NE(plan_item(po, "optimizer offload staging (pinned)"), nullptr);
  EXPECT_EQ(p3.alloc_peak_bytes - po.alloc_peak_bytes, dev->bytes);  // the step's peak, minus exactly them
  EXPECT_GT(po.host_rank_peak_bytes, p3.host_rank_peak_bytes);
}

// ZeRO-3 with parallel.zero.offload_params (on top of the optimizer offload): the bf16
// parameter shards move from each GPU to pinned host memory byte for byte (outside the device
// counters), every phase's allocations drop by exactly them and every phase's host memory
// rises by them (initialisation too: the shards are loaded as shards, nothing whole is freed
// on the way); a run that fits only without them is refused naming the key.
TEST(MemoryPlan, ZeroThreeWithParamOffload) {
  StageConfig zo = big_run();
  zo.parallel.zero.stage = 3;
  zo.parallel.zero.offload_optimizer = true;
  StageConfig zp = zo;
  zp.parallel.zero.offload_params = true;
  const MemoryPlan po = plan::plan_memory(zo, gpu_target(2000, 8)), pp = plan::plan_memory(zp, gpu_target(2000, 8));
  const plan::PlanItem* dev = plan_item(po, "bf16 working parameter shard");
  const plan::PlanItem* host = plan_item(pp, "bf16 working parameter shard (offloaded, pinned)");
  ASSERT_NE(dev, nullptr);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(plan_item(pp, "bf16 working parameter shard"), nullptr);
  EXPECT_EQ(dev->where, "gpu");
  EXPECT_EQ(host->where, "host");
  EXPECT_FALSE(host->tracked);
  EXPECT_EQ(host->bytes, dev->bytes);
  EXPECT_GE(host->bytes, 2 * po.parameters / 8);  // 2 x sum ceil(unit / 8): 2P/8 plus padding per unit
  EXPECT_LE(host->bytes, 2 * (po.parameters / 8 + 64));
  ASSERT_EQ(po.phases.size(), pp.phases.size());
  for (size_t i = 0; i < po.phases.size(); ++i) {
    EXPECT_EQ(po.phases[i].alloc_bytes - pp.phases[i].alloc_bytes, dev->bytes) << po.phases[i].name;
    EXPECT_EQ(pp.phases[i].host_bytes - po.phases[i].host_bytes, dev->bytes) << po.phases[i].name;
  }
  EXPECT_EQ(po.alloc_peak_bytes - pp.alloc_peak_bytes, dev->bytes);
  // A GPU between the two peaks: refused, and the knob is named.
  expect_refusal_names_knob(zo, po, zp, pp, "parallel.zero.offload_params=true");
}

// ZeRO-3 with parallel.zero.offload_grads (on top of the optimizer offload): the layers' fp32
// gradient shards move from each GPU to pinned host memory byte for byte (the embedding's and
// head's stay), plus one layer shard of pinned staging per reduce-scatter buffer; every
// phase's allocations drop by exactly the moved shards and every phase's host memory rises by
// them and the staging; a run that fits only without them is refused naming the key.
TEST(MemoryPlan, ZeroThreeWithGradOffload) {
  StageConfig zo = big_run();
  zo.parallel.zero.stage = 3;
  zo.parallel.zero.offload_optimizer = true;
  StageConfig zg = zo;
  zg.parallel.zero.offload_grads = true;
  const MemoryPlan po = plan::plan_memory(zo, gpu_target(2000, 8)), pg = plan::plan_memory(zg, gpu_target(2000, 8));
  const plan::PlanItem* dev = plan_item(po, "fp32 reduced gradient shard");
  const plan::PlanItem* kept = plan_item(pg, "fp32 reduced gradient shard");
  const plan::PlanItem* host = plan_item(pg, "fp32 reduced gradient shard (offloaded, pinned)");
  const plan::PlanItem* staging = plan_item(pg, "fp32 reduce-scatter result staging (pinned)");
  const plan::PlanItem* part = plan_item(po, "fp32 reduce-scatter result (one layer shard)");
  ASSERT_NE(dev, nullptr);
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(staging, nullptr);
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(host->where, "host");
  EXPECT_EQ(staging->where, "host");
  EXPECT_FALSE(host->tracked);
  EXPECT_EQ(kept->where, "gpu");
  EXPECT_EQ(host->bytes + kept->bytes, dev->bytes);  // every unit's shard, split between the two
  // The 32 layers' shards: 4 x ceil(unit / 8) each (llama2-7b: 202,383,360 parameters a layer).
  EXPECT_EQ(host->bytes, 32 * 4 * ((int64_t{202383360} + 7) / 8));
  EXPECT_EQ(staging->bytes, part->bytes);  // one per reduce-scatter buffer
  ASSERT_EQ(po.phases.size(), pg.phases.size());
  for (size_t i = 0; i < po.phases.size(); ++i) {
    EXPECT_EQ(po.phases[i].alloc_bytes - pg.phases[i].alloc_bytes, host->bytes) << po.phases[i].name;
    EXPECT_EQ(pg.phases[i].host_bytes - po.phases[i].host_bytes, host->bytes + staging->bytes) << po.phases[i].name;
  }
  expect_refusal_names_knob(zo, po, zg, pg, "parallel.zero.offload_grads=true");
}

// On ONE GPU a stage-0 run that fits only with its weights, gradients and optimizer in host
// memory: the search proposes ZeRO-3 over the group of one with the three offloads (stage 3
// alone would only add the gather pool), and that proposal plans as fitting.
TEST(MemoryPlan, OneGpuSearchProposesZeroThreeWithOffloads) {
  StageConfig c = big_run();
  c.data.seq_length = 65536;
  StageConfig z = c;
  z.parallel.zero.stage = 3;
  z.parallel.zero.offload_optimizer = z.parallel.zero.offload_params = z.parallel.zero.offload_grads = true;
  const MemoryPlan pz = plan::plan_memory(z, gpu_target(2000));
  const double gib = 1.01 * static_cast<double>(pz.gpu_peak_bytes) / (1 << 30) / (1 - pz.target.headroom);
  const MemoryPlan p = plan::plan_memory(c, gpu_target(gib));
  ASSERT_FALSE(p.fits);
  bool named = false;
  for (const plan::KnobFix& k : p.knobs)
    named |= k.assignment.find("parallel.zero.stage=3") != std::string::npos &&
             k.assignment.find("parallel.zero.offload_grads=true") != std::string::npos;
  EXPECT_TRUE(named) << plan::refusal_message(p);
  EXPECT_TRUE(plan::plan_memory(z, gpu_target(gib)).fits);
}

// ZeRO-3 with the optimizer offloaded on 2 nodes x 8 GPUs (llama2-7b at 32K, the weights from
// a Hugging Face folder not present here, the HF export at the end): no rank ever holds the
// whole model (loading reads the shards; the export's whole model is rank 0's alone), so the
// busiest node holds less than one copy of the model state (16 bytes per parameter), where
// stage 0 holds eight (12 P per rank); the JSON's categories add up to its peaks.
TEST(MemoryPlan, ZeroThreeHostPerNodeIsOneCopyNotOnePerRank) {
  StageConfig c = big_run();
  c.data.seq_length = 32768;
  c.model.init = "hf:/nonexistent/Llama-2-7b-hf";
  c.parallel.zero.offload_optimizer = true;
  c.output.export_hf = true;
  StageConfig z = c;
  z.parallel.zero.stage = 3;
  const MemoryPlan p0 = plan::plan_memory(c, gpu_target(80, 8, 2)), p3 = plan::plan_memory(z, gpu_target(80, 8, 2));
  const int64_t P = p3.parameters;
  ASSERT_TRUE(p3.fits) << plan::refusal_message(p3);
  ASSERT_EQ(p3.notes.size(), 2u);  // (the second: the attention outputs that would fit, a layer run's hint)
  EXPECT_EQ(p3.notes[1].rfind("activation.checkpoint layer: attention_output", 0), 0u) << p3.notes[1];
  EXPECT_NE(p3.notes[0].find("model.init hf:/nonexistent/Llama-2-7b-hf is not here: planned with model.config "
                             "llama2-7b"),
            std::string::npos)
      << p3.notes[0];
  bool root_export = false;
  for (const plan::PlanItem& i : p3.items) {
    if (i.where != "host") continue;
    if (i.ranks != plan::Ranks::Root) { EXPECT_LT(i.bytes, P) << i.name << " (" << i.phase << ")"; }
    root_export |= i.ranks == plan::Ranks::Root && i.phase == "HF export (gather)" && i.bytes >= 4 * P;
  }
  EXPECT_TRUE(root_export);
  EXPECT_LT(p3.host_peak_bytes, 16 * P);
  EXPECT_GT(p0.host_peak_bytes, 8 * 12 * P);
  std::printf(
      "[plan] llama2-7b 32K, 2 x 8 GPUs, optimizer offloaded: host per node %.1f GiB at ZeRO-3 (%s), %.1f GiB "
      "at stage 0; one copy of the model state 16 P = %.1f GiB\n",
      static_cast<double>(p3.host_peak_bytes) / (1 << 30), p3.host_peak_phase.c_str(),
      static_cast<double>(p0.host_peak_bytes) / (1 << 30), 16.0 * static_cast<double>(P) / (1 << 30));
  const Json j = plan::plan_to_json(p3);
  int64_t gpu = 0, host = 0;
  for (const auto& [k, v] : j.at("gpu").at("by_category").as_object())
    if (v.is_integer()) gpu += v.as_int();
  for (const auto& [k, v] : j.at("host").at("by_category").as_object())
    if (v.is_integer()) host += v.as_int();
  EXPECT_EQ(gpu, p3.gpu_peak_bytes);
  int64_t rank0_at_peak = -1;
  for (const plan::PhaseTotal& ph : p3.phases)
    if (ph.name == p3.host_peak_phase) rank0_at_peak = ph.host_bytes;
  EXPECT_EQ(host, rank0_at_peak);
  EXPECT_EQ(j.at("settings").at("parallel.zero.stage").as_int(), 3);
  EXPECT_EQ(j.at("host").at("per_node_peak_bytes").as_int(), p3.host_peak_bytes);
}

TEST(MemoryPlan, JsonRoundTripsAndCompareLineNamesBoth) {
  const MemoryPlan p = plan::plan_memory(big_run(), gpu_target(139));
  const Json j = parse_json(plan::plan_to_json(p).dump(2));
  EXPECT_EQ(j.at("fits").as_bool(), p.fits);
  EXPECT_EQ(j.at("gpu").at("device_total_bytes").as_int(), p.gpu_peak_bytes);
  EXPECT_EQ(j.at("gpu").at("context_bytes").as_int(), plan::kCudaContextBytes);
  EXPECT_EQ(j.at("items").size(), p.items.size());
  int64_t context = 0;
  for (const plan::PlanItem& i : p.items)
    if (!i.tracked && i.where == "gpu") context += i.bytes;
  EXPECT_EQ(context, plan::kCudaContextBytes);
  EXPECT_EQ(p.gpu_peak_bytes, p.alloc_peak_bytes + p.context_bytes);
  ops::MemoryStats m;
  m.peak_bytes = p.alloc_peak_bytes + (int64_t{1} << 30);
  const std::string line = plan::compare_line(p, m, 3.0 * (1 << 30));
  EXPECT_NE(line.find("predicted peak"), std::string::npos) << line;
  EXPECT_NE(line.find("measured 3.00 GiB (VmHWM"), std::string::npos) << line;
  EXPECT_NE(line.find("host predicted"), std::string::npos) << line;
  EXPECT_NE(line.find("per GPU"), std::string::npos) << line;
  const std::string table = plan::format_plan_table(p);
  EXPECT_NE(table.find("fp32 master weights"), std::string::npos) << table;
}

// ---- target keys
TEST(PlanTarget, KeysAreValidatedNamingKeyValueAndRange) {
  auto error_of = [](const std::string& yaml) -> std::string {
    try {
      parse_stage_config(yaml, "stage.yaml");
    } catch (const InputError& e) { return e.what(); }
    return "";
  };
  std::string e = error_of("target:\n  headroom: 1.5\n");
  EXPECT_NE(e.find("target.headroom: bad value '1.5': expected a number in [0.0, 1.0)"), std::string::npos) << e;
  e = error_of("target:\n  gpu_memory_gib: -1\n");
  EXPECT_NE(e.find("target.gpu_memory_gib: bad value '-1'"), std::string::npos) << e;
  e = error_of("target:\n  nodes: two\n");
  EXPECT_NE(e.find("target.nodes: bad value 'two': expected an integer"), std::string::npos) << e;
  e = error_of("target:\n  gpus_per_nodes: 8\n");
  EXPECT_NE(e.find("did you mean 'target.gpus_per_node'"), std::string::npos) << e;

  StageConfig c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: X100\n", "stage.yaml");
  try {
    plan::resolve_target(c, 1, 1);
    ADD_FAILURE() << "unknown GPU accepted";
  } catch (const InputError& err) {
    e = err.what();
    EXPECT_NE(e.find("target.gpu: unknown GPU 'X100'"), std::string::npos) << e;
    EXPECT_NE(e.find("H200"), std::string::npos) << e;
  }
  // Any name with its memory is fine.
  c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: X100\n  gpu_memory_gib: 100\n", "stage.yaml");
  EXPECT_EQ(plan::resolve_target(c, 1, 1).gpu_memory_bytes, int64_t{100} << 30);
  // The sequence-parallel size must divide the target's world.
  c = parse_stage_config(
      "model:\n  config: tiny\ntrain:\n  device: cpu\nparallel:\n  sequence:\n    size: 3\n"
      "target:\n  nodes: 2\n  gpus_per_node: 2\n",
      "stage.yaml");
  const plan::PlanTarget t = plan::resolve_target(c, 1, 1);
  EXPECT_EQ(t.world(), 4);
  try {
    plan::plan_memory(c, t);
    ADD_FAILURE() << "sequence size 3 on 4 ranks accepted";
  } catch (const InputError& err) {
    e = err.what();
    EXPECT_NE(e.find("parallel.sequence.size = 3 does not divide the world size 4"), std::string::npos) << e;
    EXPECT_NE(e.find("target.nodes x target.gpus_per_node"), std::string::npos) << e;
  }
}

TEST(PlanTarget, ResolvesFromKeysLaunchAndMachine) {
  StageConfig c;
  c.train.device = DeviceKind::Cpu;
  plan::PlanTarget t = plan::resolve_target(c, 4, 2);  // launch: 4 ranks, 2 per node
  EXPECT_EQ(t.backend, DeviceKind::Cpu);
  EXPECT_EQ(t.gpus_per_node, 2);
  EXPECT_EQ(t.nodes, 2);
  EXPECT_GT(t.host_memory_bytes, 0);  // /proc/meminfo
  c.target.nodes = 2;
  c.target.gpus_per_node = 8;
  c.target.host_memory_gib = 1024;
  c.target.gpu = "h200";  // case does not matter
  c.train.device = DeviceKind::Auto;
  t = plan::resolve_target(c, 1, 1);
  EXPECT_EQ(t.backend, DeviceKind::Cuda);  // a named GPU plans for cuda
  EXPECT_EQ(t.gpu_name, "H200");
  EXPECT_EQ(t.gpu_memory_bytes, int64_t{150109880320});  // totalGlobalMem of an H200
  EXPECT_EQ(t.world(), 16);
  EXPECT_EQ(t.host_memory_bytes, int64_t{1024} << 30);
  c.target.gpu_memory_gib = 80;  // overrides the model's memory
  EXPECT_EQ(plan::resolve_target(c, 1, 1).gpu_memory_bytes, int64_t{80} << 30);
  EXPECT_GT(plan::vm_hwm_bytes(), 0);
}

// The process baseline is one rule for the training and the inference (evaluation) plans: a
// plan made inside the program (process_bytes: its VmRSS, above the calibrated constant)
// counts what the program already holds, else the constant; both plans say which.
TEST(PlanTarget, ProcessBaselineIsOneRuleForTrainingAndInference) {
  StageConfig c = load_stage_config(source_dir() + "/configs/bench/llama2-7b-1gpu.yaml");
  c.data.path = "unused";
  c.data.seq_length = 256;
  c.model.config = "tinyllama-1b";
  c.train.device = DeviceKind::Cpu;
  c.parallel.zero.offload_optimizer = false;  // (CUDA only)
  plan::InferencePlanInput in;
  in.model = model::resolve_llama_config(c.model);
  in.cfg = c;
  auto baseline = [](const MemoryPlan& p) {
    for (const plan::PlanItem& i : p.items)
      if (i.name.rfind("process baseline", 0) == 0) return i;
    return plan::PlanItem{};
  };
  for (const int64_t rss : {int64_t{0}, int64_t{700} << 20}) {
    plan::PlanTarget t;
    t.backend = DeviceKind::Cpu;
    t.host_memory_bytes = int64_t{64} << 30;
    t.process_bytes = rss;
    const plan::PlanItem train = baseline(plan::plan_memory(c, t)), eval = baseline(plan::plan_inference(in, t));
    EXPECT_EQ(train.bytes, rss > 0 ? rss : plan::kHostBaselineCpuBytes) << rss;
    EXPECT_EQ(eval.bytes, train.bytes) << rss;
    EXPECT_EQ(eval.formula, train.formula) << rss;
    EXPECT_NE(eval.formula.find(rss > 0 ? "VmRSS" : "kHostBaselineCpuBytes"), std::string::npos) << eval.formula;
  }
}

// The plan names the attention forward's route the target GPU takes: the Hopper kernel on an
// sm_90 GPU at head dim 128 (train.hopper_attention), cuDNN's causal graph on an A100 or with
// the key off; the bytes do not change (the Hopper kernel takes no scratch).
TEST(PlanTarget, HopperForwardRouteByGpu) {
  EXPECT_TRUE(plan::is_hopper_gpu("H200"));
  EXPECT_TRUE(plan::is_hopper_gpu("NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(plan::is_hopper_gpu("NVIDIA GH200 480GB"));
  EXPECT_FALSE(plan::is_hopper_gpu("A100-80GB"));
  EXPECT_FALSE(plan::is_hopper_gpu("NVIDIA A100-SXM4-80GB"));
  StageConfig c = load_stage_config(source_dir() + "/configs/bench/llama2-7b-1gpu.yaml");
  c.data.path = "unused";
  c.data.seq_length = 32768;
  auto target = [](const char* gpu) {
    plan::PlanTarget t;
    t.backend = DeviceKind::Cuda;
    t.gpu_name = gpu;
    t.gpu_memory_bytes = int64_t{80} << 30;
    t.host_memory_bytes = int64_t{1024} << 30;
    return t;
  };
  auto forward_route = [](const MemoryPlan& p) {
    for (const std::string& r : p.attention_routes)
      if (r.rfind("forward", 0) == 0) return r;
    return std::string("(none)");
  };
  const MemoryPlan h = plan::plan_memory(c, target("H100"));
  const MemoryPlan a = plan::plan_memory(c, target("A100-80GB"));
  StageConfig off = c;
  off.train.hopper_attention = false;
  const MemoryPlan ho = plan::plan_memory(off, target("H100"));
  EXPECT_EQ(forward_route(h), "forward causal 32768x32768 32/32x128: sm90 kernel");
  EXPECT_EQ(forward_route(a), "forward causal 32768x32768 32/32x128: cudnn causal graph");
  EXPECT_EQ(forward_route(ho), forward_route(a));
  EXPECT_EQ(h.alloc_peak_bytes, a.alloc_peak_bytes);
  EXPECT_EQ(h.alloc_peak_bytes, ho.alloc_peak_bytes);
}

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// The plans behind docs/memory-model.md's long-context examples, from the bench config
// (llama2-7b, optimizer offloaded, MLP in 16K tiles) on H200 targets:
//  - 256K on one GPU of a 128 GiB host: the refusal offers activation.offload with the fewest
//    layer inputs that fit (one fewer does not), and that plan's host side fits too;
//  - 1M on 2 GPUs (zigzag ring, all checkpoints offloaded, a 2 TB host): does not fit in one
//    attention pass, fits with the ring in 4 head groups, which the refusal offers.
TEST(MemoryPlan, LongContextKnobsOffloadLayersAndHeadGroups) {
  StageConfig c = load_stage_config(source_dir() + "/configs/bench/llama2-7b-1gpu.yaml");
  c.data.path = "unused";
  c.parallel.zero.offload_optimizer = true;  // (auto would split it between the GPU and the host)
  c.parallel.zero.offload_optimizer_auto = false;
  auto h200 = [](int gpus, double host_gib) {
    plan::PlanTarget t;
    t.backend = DeviceKind::Cuda;
    t.gpu_name = "H200";
    t.gpu_memory_bytes = int64_t{150754820096};
    t.gpus_per_node = gpus;
    t.host_memory_bytes = static_cast<int64_t>(host_gib * (int64_t{1} << 30));
    return t;
  };
  StageConfig s256 = c;
  s256.data.seq_length = 262144;
  const MemoryPlan p = plan::plan_memory(s256, h200(1, 128));
  ASSERT_FALSE(p.fits);
  const plan::KnobFix* off = nullptr;
  for (const plan::KnobFix& k : p.knobs)
    if (k.assignment.rfind("activation.offload=cpu activation.offload_layers=", 0) == 0) off = &k;
  ASSERT_NE(off, nullptr) << plan::refusal_message(p);
  StageConfig fixed = s256;
  for (const std::string& a : split(off->assignment, ' ')) apply_override(fixed, a);
  const MemoryPlan q = plan::plan_memory(fixed, h200(1, 128));
  EXPECT_TRUE(q.fits && q.host_fits) << off->assignment;
  StageConfig fewer = fixed;
  fewer.activation.offload_layers -= 1;
  if (fewer.activation.offload_layers > 0) {
    EXPECT_FALSE(plan::plan_memory(fewer, h200(1, 128)).fits) << off->assignment;
  }
  // Every checkpoint offloaded needs more host memory than this host has.
  StageConfig all = s256;
  all.activation.offload = OffloadTarget::Cpu;
  EXPECT_FALSE(plan::plan_memory(all, h200(1, 128)).host_fits);

  StageConfig m1 = c;
  m1.data.seq_length = 1048576;
  m1.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  m1.parallel.sequence.size = 2;
  m1.activation.offload = OffloadTarget::Cpu;
  const MemoryPlan one_pass = plan::plan_memory(m1, h200(2, 2048));
  EXPECT_FALSE(one_pass.fits);
  bool offered = false;
  for (const plan::KnobFix& k : one_pass.knobs)
    offered |= k.assignment.rfind("activation.attention_head_groups=", 0) == 0;
  EXPECT_TRUE(offered) << plan::refusal_message(one_pass);
  m1.activation.attention_head_groups = 4;
  const MemoryPlan four = plan::plan_memory(m1, h200(2, 2048));
  EXPECT_TRUE(four.fits) << plan::refusal_message(four);
  std::printf("[plan] 1M on 2 H200: one pass %.2f GiB per GPU, 4 head groups %.2f GiB\n",
              static_cast<double>(one_pass.gpu_peak_bytes) / (1 << 30),
              static_cast<double>(four.gpu_peak_bytes) / (1 << 30));
}

// activation.attention_output_layers at 256K on one H200 with a 128 GiB host (the bench
// config, the optimizer in host memory, 17 layer inputs offloaded): every layer's attention
// output does not fit, and the
// refusal names the most layers that do (one more does not). The plan counts the kept outputs
// exactly: the last 16 layers' (16..31, whose inputs stay) on the GPU, each one more below
// them (whose input leaves, layer 15 down) in host memory; the key needs attention_output.
TEST(MemoryPlan, KeptAttentionOutputsFillWhatLayerLeaves) {
  const auto plan_of = [](const std::vector<std::string>& extra) {
    std::vector<std::string> sets{"data.seq_length=262144", "activation.offload=cpu", "activation.offload_layers=17",
                                  "parallel.zero.offload_optimizer=true"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return plan_bench(sets);
  };
  const MemoryPlan layer = plan_of({});
  ASSERT_TRUE(layer.fits) << plan::refusal_message(layer);
  const MemoryPlan all = plan_of({"activation.checkpoint=attention_output"});
  ASSERT_FALSE(all.fits);
  int64_t offered = 0;
  for (const plan::KnobFix& k : all.knobs)
    if (k.assignment.rfind("activation.attention_output_layers=", 0) == 0)
      offered = std::stoll(k.assignment.substr(k.assignment.find('=') + 1));
  ASSERT_GT(offered, 0) << plan::refusal_message(all);
  const auto kept = [&](int64_t m) {
    return plan_of(
        {"activation.checkpoint=attention_output", "activation.attention_output_layers=" + std::to_string(m)});
  };
  EXPECT_TRUE(kept(offered).fits);
  EXPECT_FALSE(kept(offered + 1).fits);
  const int64_t n = 262144, per_layer = n * 4096 * 2 + 32 * n * 4;  // o bf16 [n, 32 x 128], LSE f32 [32, n]
  const MemoryPlan k16 = kept(16), k20 = kept(20);
  EXPECT_EQ(k16.alloc_peak_bytes - layer.alloc_peak_bytes, 16 * per_layer);
  EXPECT_EQ(k20.alloc_peak_bytes, k16.alloc_peak_bytes);
  EXPECT_EQ(k20.host_peak_bytes - k16.host_peak_bytes, 4 * per_layer);
  std::printf(
      "[plan] 256K, 17 inputs offloaded: layer %.2f GiB per GPU / %.2f host; attention_output_layers "
      "16: %.2f / %.2f, 20: %.2f / %.2f; the most that fit: %lld\n",
      static_cast<double>(layer.gpu_peak_bytes) / (1 << 30), static_cast<double>(layer.host_peak_bytes) / (1 << 30),
      static_cast<double>(k16.gpu_peak_bytes) / (1 << 30), static_cast<double>(k16.host_peak_bytes) / (1 << 30),
      static_cast<double>(k20.gpu_peak_bytes) / (1 << 30), static_cast<double>(k20.host_peak_bytes) / (1 << 30),
      static_cast<long long>(offered));
  try {
    plan_of({"activation.attention_output_layers=4"});
    ADD_FAILURE() << "attention_output_layers with checkpoint layer was planned";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activation.attention_output_layers: 4 needs activation.checkpoint: attention_output"),
              std::string::npos)
        << m;
  }
}

// A `layer` run that fits on a GPU gets the note naming the most layers that could keep their
// attention output (checkpoint attention_output, attention_output_layers) with the optimizer
// where the plan put it: as the run is, and, when that keeps more, with the fewest more layer
// inputs in pinned host memory. The bench's 7B on one H200: at 32K 22 layers as it is
// (measured 6,968 tok/s against layer's 6,552 in the same call, bench/RESULTS.md session 27),
// every layer with 6 inputs offloaded; at 64K (the GPU full with 12 inputs offloaded) none as
// it is, every layer with 23. Each count is the plan's edge: one more does not fit.
TEST(MemoryPlan, LayerRunsNameTheAttentionOutputsThatFit) {
  const auto plan_of = [](int64_t seq, const std::vector<std::string>& extra) {
    std::vector<std::string> sets{"data.seq_length=" + std::to_string(seq)};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return plan_bench(sets);
  };
  const auto hint_of = [](const MemoryPlan& p) {
    for (const std::string& n : p.notes)
      if (n.rfind("activation.checkpoint layer:", 0) == 0) return n;
    return std::string();
  };
  const auto fits = [&](int64_t seq, int64_t kept, int64_t offload) {
    std::vector<std::string> sets{"activation.checkpoint=attention_output", "parallel.zero.offload_optimizer=false",
                                  "activation.attention_output_layers=" + std::to_string(kept)};
    if (offload > 0) {
      sets.push_back("activation.offload=cpu");
      sets.push_back("activation.offload_layers=" + std::to_string(offload));
    }
    const MemoryPlan p = plan_of(seq, sets);
    EXPECT_TRUE(hint_of(p).empty());  // (attention_output runs get no hint)
    return p.fits;
  };
  const std::string at32 = hint_of(plan_of(32768, {}));
  EXPECT_EQ(at32.rfind("activation.checkpoint layer: attention_output, activation.offload cpu, "
                       "activation.offload_layers 6 (6 more layer inputs in pinned host memory) would fit too",
                       0),
            0u)
      << at32;
  EXPECT_NE(at32.find("with the offload as it is, attention_output with activation.attention_output_layers 22"),
            std::string::npos)
      << at32;
  EXPECT_TRUE(fits(32768, 22, 0));
  EXPECT_FALSE(fits(32768, 23, 0));
  EXPECT_TRUE(fits(32768, 0, 6));
  EXPECT_FALSE(fits(32768, 0, 5));
  const std::string at64 = hint_of(plan_of(65536, {}));
  EXPECT_NE(at64.find("activation.offload_layers 23 (11 more layer inputs in pinned host memory) would fit too"),
            std::string::npos)
      << at64;
  EXPECT_NE(at64.find("with the offload as it is, none fits"), std::string::npos) << at64;
  EXPECT_TRUE(fits(65536, 0, 23));
  EXPECT_FALSE(fits(65536, 0, 22));
  EXPECT_FALSE(fits(65536, 1, 12));
  std::printf("[plan] 32K: %s\n[plan] 64K: %s\n", at32.c_str(), at64.c_str());
}

// activation.checkpoint auto on the bench's 7B and one H200 (128 GiB host as planned for the
// bench): the plan of the config the trainer then runs (apply_placement, apply_checkpoint),
// with the most layers keeping their attention output: at 32K and 64K every layer, with the
// fewest more layer inputs in host memory that allow it (the hint's counts, the test above;
// 64K measured 5,237 tok/s against layer's 4,562, bench/RESULTS.md session 28); at 128K the
// optimizer moves to host memory, since with it on the GPU one layer would keep its output.
TEST(MemoryPlan, CheckpointAutoKeepsTheMostAttentionOutputs) {
  const auto plan_of = [](int64_t seq, const std::vector<std::string>& extra) {
    std::vector<std::string> sets{"data.seq_length=" + std::to_string(seq), "activation.checkpoint=auto"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return plan_bench(sets);
  };
  const auto note_of = [](const MemoryPlan& p, const std::string& head) {
    for (const std::string& n : p.notes)
      if (n.rfind(head, 0) == 0) return n;
    return std::string();
  };
  // What the trainer runs: both choices written into the config, planned again.
  const auto rerun = [](int64_t seq, const MemoryPlan& a) {
    StageConfig c = bench_config({"data.seq_length=" + std::to_string(seq), "activation.checkpoint=auto"});
    plan::apply_placement(c, plan::placement_of(a));
    plan::apply_checkpoint(c, a.auto_checkpoint);
    EXPECT_FALSE(c.activation.checkpoint_auto);
    const MemoryPlan p = plan_bench(c);
    EXPECT_EQ(p.gpu_peak_bytes, a.gpu_peak_bytes) << seq;
    EXPECT_EQ(p.host_peak_bytes, a.host_peak_bytes) << seq;
    EXPECT_EQ(p.settings.dump(), a.settings.dump()) << seq;
    return c;
  };
  const MemoryPlan a32 = plan_of(32768, {}), a64 = plan_of(65536, {}), a128 = plan_of(131072, {});
  for (const MemoryPlan* p : {&a32, &a64, &a128}) ASSERT_TRUE(p->fits);
  EXPECT_EQ(a32.auto_checkpoint, "attention_output 0 6");
  EXPECT_EQ(a64.auto_checkpoint, "attention_output 0 23");
  EXPECT_EQ(a128.auto_checkpoint, "attention_output 0 -1");
  EXPECT_EQ(plan::placement_of(a32), "gpu 0");
  EXPECT_EQ(plan::placement_of(a64), "gpu 12");  // the optimizer's placement stands; 11 more inputs move
  EXPECT_EQ(plan::placement_of(a128), "host");
  const StageConfig c64 = rerun(65536, a64);
  EXPECT_EQ(c64.activation.checkpoint, CheckpointPolicy::AttentionOutput);
  EXPECT_EQ(c64.activation.attention_output_layers, 0);
  EXPECT_EQ(c64.activation.offload, OffloadTarget::Cpu);
  EXPECT_EQ(c64.activation.offload_layers, 23);
  EXPECT_FALSE(c64.parallel.zero.offload_optimizer);
  rerun(32768, a32);
  EXPECT_TRUE(rerun(131072, a128).parallel.zero.offload_optimizer);
  EXPECT_EQ(
      note_of(a64, "activation.checkpoint auto: ")
          .rfind("activation.checkpoint auto: attention_output, activation.offload cpu, activation.offload_layers 23 "
                 "(11 more layer inputs in pinned host memory) (136.56 GiB of 137.00 GiB usable per GPU",
                 0),
      0u)
      << note_of(a64, "activation.checkpoint auto: ");
  const std::string host = note_of(a128, "parallel.zero.offload_optimizer auto: ");
  EXPECT_EQ(host.rfind("parallel.zero.offload_optimizer auto: in host memory, so that 31 more layers keep their "
                       "attention output (activation.checkpoint auto): ~7.9 s of attention forward saved per step "
                       "against ~1.2 s of host update",
                       0),
            0u)
      << host;
  // Each micro-batch saves the attention forwards, the update is once per step.
  const std::string accum = note_of(plan_of(131072, {"train.grad_accum=2"}), "parallel.zero.offload_optimizer auto: ");
  EXPECT_NE(accum.find("~15.9 s of attention forward saved per step against ~1.2 s"), std::string::npos) << accum;
  // The same plans as the settings written by hand (attention_output, offload, the optimizer).
  const MemoryPlan h64 =
      plan_bench({"data.seq_length=65536", "activation.checkpoint=attention_output", "activation.offload=cpu",
                  "activation.offload_layers=23", "parallel.zero.offload_optimizer=false"});
  EXPECT_EQ(h64.gpu_peak_bytes, a64.gpu_peak_bytes);
  EXPECT_EQ(h64.host_peak_bytes, a64.host_peak_bytes);
  // A set activation offload is the user's: auto keeps it and counts the layers that fit with it.
  const MemoryPlan u = plan_of(
      65536, {"activation.offload=cpu", "activation.offload_layers=20", "parallel.zero.offload_optimizer=false"});
  ASSERT_TRUE(u.fits);
  EXPECT_EQ(u.auto_checkpoint.rfind("attention_output ", 0), 0u) << u.auto_checkpoint;
  EXPECT_EQ(split(u.auto_checkpoint, ' ')[2], "-1") << u.auto_checkpoint;
  const int64_t m = std::stoll(split(u.auto_checkpoint, ' ')[1]);
  ASSERT_GT(m, 0);
  ASSERT_LT(m, 32);  // with 20 inputs out, not every layer: the count is the plan's edge
  const auto kept = [](int64_t k) {
    return plan_bench({"data.seq_length=65536", "activation.checkpoint=attention_output", "activation.offload=cpu",
                       "activation.offload_layers=20", "parallel.zero.offload_optimizer=false",
                       "activation.attention_output_layers=" + std::to_string(k)});
  };
  EXPECT_TRUE(kept(m).fits);
  EXPECT_FALSE(kept(m + 1).fits);
  std::printf("[auto] 32K: %s\n[auto] 64K: %s\n[auto] 128K: %s; %s\n[auto] 64K, 20 inputs offloaded: %s\n",
              a32.auto_checkpoint.c_str(), a64.auto_checkpoint.c_str(), a128.auto_checkpoint.c_str(), host.c_str(),
              u.auto_checkpoint.c_str());
  // Not a CUDA run: the plan of the host; the tiny model keeps every layer's output.
  StageConfig c = big_run();
  c.train.device = DeviceKind::Cpu;
  c.model.config = "tiny";
  c.data.seq_length = 256;
  c.activation.checkpoint_auto = true;
  const MemoryPlan cpu = plan::plan_memory(c, cpu_target());
  EXPECT_EQ(cpu.auto_checkpoint, "attention_output 0 -1");
}

// The choice every rank takes (the trainer's reduce over the ranks): the common one, else layer.
TEST(MemoryPlan, RanksAgreeOnTheCheckpoints) {
  EXPECT_EQ(plan::agree_checkpoint({"attention_output 0 23"}), "attention_output 0 23");
  EXPECT_EQ(plan::agree_checkpoint({"attention_output 0 23", "attention_output 0 23"}), "attention_output 0 23");
  EXPECT_EQ(plan::agree_checkpoint({"attention_output 0 23", "attention_output 5 -1"}), "layer");
  EXPECT_EQ(plan::agree_checkpoint({"layer", "layer"}), "layer");
  for (const std::string bad : {"", "attention_output", "attention_output 1", "attention_output -1 2",
                                "attention_output 1 -2", "attention_output 1 x", "Layer", "attention_output 1 2 3"})
    EXPECT_THROW(plan::agree_checkpoint({"layer", bad}), Error) << "'" << bad << "'";
  StageConfig c;
  c.activation.checkpoint_auto = true;
  plan::apply_checkpoint(c, "attention_output 20 -1");
  EXPECT_EQ(c.activation.checkpoint, CheckpointPolicy::AttentionOutput);
  EXPECT_EQ(c.activation.attention_output_layers, 20);
  EXPECT_EQ(c.activation.offload, OffloadTarget::None);
  EXPECT_FALSE(c.activation.checkpoint_auto);
  plan::apply_checkpoint(c, "attention_output 0 7");
  EXPECT_EQ(c.activation.offload, OffloadTarget::Cpu);
  EXPECT_EQ(c.activation.offload_layers, 7);
  plan::apply_checkpoint(c, "layer");
  EXPECT_EQ(c.activation.checkpoint, CheckpointPolicy::Layer);
  EXPECT_EQ(c.activation.attention_output_layers, 0);
}
}  // namespace
}  // namespace easyctx::test
