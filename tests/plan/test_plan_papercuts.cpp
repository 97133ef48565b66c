// First-hour papercuts of --print-config and --plan: the process-group layout prints on one
// process for any sequence-parallel size; a plan for GPUs named by target.gpu assumes their
// nodes' host memory (never the login node's); a plan short of host memory only says so.
#include <gtest/gtest.h>

#include "core/config.h"
#include "dist/groups.h"
#include "plan/memory_plan.h"
#include "plan/target.h"

namespace easyctx::test {
namespace {

TEST(PrintConfigWorld, OneProcessShowsTheSmallestWorldTheConfigNeeds) {
  StageConfig c = parse_stage_config("parallel:\n  sequence:\n    size: 2\n", "stage.yaml");
  const plan::LayoutWorld w = plan::print_config_world(c, 1, 1);
  EXPECT_EQ(w.world, 2);
  EXPECT_EQ(w.ranks_per_node, 2);
  EXPECT_NE(w.note.find("smallest world for parallel.sequence.size = 2"), std::string::npos) << w.note;
  const dist::GroupLayout L = dist::make_group_layout(c, w.world, w.ranks_per_node);
  EXPECT_EQ(L.sp_size, 2);
  EXPECT_EQ(L.dp_size, 1);
}

TEST(PrintConfigWorld, TargetAndLaunchWin) {
  StageConfig c = parse_stage_config("parallel:\n  sequence:\n    size: 4\ntarget:\n  nodes: 2\n  gpus_per_node: 8\n",
                                     "stage.yaml");
  plan::LayoutWorld w = plan::print_config_world(c, 1, 1);
  EXPECT_EQ(w.world, 16);
  EXPECT_EQ(w.ranks_per_node, 8);
  EXPECT_EQ(dist::make_group_layout(c, w.world, w.ranks_per_node).dp_size, 4);
  c = parse_stage_config("parallel:\n  sequence:\n    size: 2\n", "stage.yaml");
  w = plan::print_config_world(c, 4, 2);  // under mpirun: the launch
  EXPECT_EQ(w.world, 4);
  EXPECT_EQ(w.ranks_per_node, 2);
  c = parse_stage_config("train:\n  steps: 3\n", "stage.yaml");
  EXPECT_EQ(plan::print_config_world(c, 1, 1).world, 1);
}

TEST(PlanHostMemory, NamedGpuAssumesItsNodesHostMemory) {
  StageConfig c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: H200\n  gpus_per_node: 8\n  nodes: 2\n",
                                     "stage.yaml");
  plan::PlanTarget t = plan::resolve_target(c, 1, 1);
  EXPECT_EQ(t.host_memory_bytes, int64_t{2048} << 30);  // DGX H200: 2 TiB per 8 GPUs
  EXPECT_NE(t.host_source.find("default for H200 nodes"), std::string::npos) << t.host_source;
  EXPECT_NE(t.host_source.find("target.host_memory_gib"), std::string::npos) << t.host_source;
  c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: A100-40GB\n  gpus_per_node: 4\n", "stage.yaml");
  EXPECT_EQ(plan::resolve_target(c, 1, 1).host_memory_bytes, int64_t{512} << 30);
  c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: H200\n  host_memory_gib: 100\n", "stage.yaml");
  t = plan::resolve_target(c, 1, 1);
  EXPECT_EQ(t.host_memory_bytes, int64_t{100} << 30);
  EXPECT_EQ(t.host_source, "target.host_memory_gib");
  // A GPU known only by its memory: this machine's, and the source says it is not its node.
  c = parse_stage_config("train:\n  device: cuda\ntarget:\n  gpu: X100\n  gpu_memory_gib: 100\n", "stage.yaml");
  EXPECT_NE(plan::resolve_target(c, 1, 1).host_source.find("set target.host_memory_gib"), std::string::npos);
}

TEST(PlanHostMemory, ShortOfHostMemoryOnlyAdvisesHostMemory) {
  StageConfig c = parse_stage_config(
      "model:\n  config: tiny\ntrain:\n  device: cuda\ntarget:\n  gpu: H200\n  host_memory_gib: 0.01\n", "stage.yaml");
  const plan::MemoryPlan p = plan::plan_memory(c, plan::resolve_target(c, 1, 1));
  ASSERT_FALSE(p.fits);
  EXPECT_TRUE(p.gpu_fits);
  EXPECT_FALSE(p.host_fits);
  const std::string m = plan::refusal_message(p);
  EXPECT_NE(m.find("predicted host"), std::string::npos) << m;
  if (p.knobs.empty()) {
    EXPECT_NE(m.find("use nodes with more host memory"), std::string::npos) << m;
    EXPECT_EQ(m.find("GPUs with more memory"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace easyctx::test
