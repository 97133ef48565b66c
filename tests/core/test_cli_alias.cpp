// EasyContext's spellings: flags rewritten to easyctx's (lib/core/cli_alias.h) and mode names
// accepted by the config registry beside the canonical ones.
#include <gtest/gtest.h>

#include "core/cli_alias.h"
#include "core/config.h"
#include "core/error.h"

using namespace easyctx;

TEST(CliAlias, RewritesFlagsAndFlagEqualsValueOnly) {
  const std::vector<FlagAlias> t = {{"--num_samples", "--samples"}, {"--haystack_dir", "--haystack-dir"}};
  const char* argv[] = {"prog", "--num_samples", "--num_samples", "--haystack_dir=dir/x", "--num_samplesx", "3",
                        "--",   "--num_samples"};
  const std::vector<std::string> got = rewrite_flag_aliases(8, argv, t);
  // A value equal to an alias after a flag is rewritten too: flags and values are not told apart,
  // which is harmless because no alias is a plausible value.
  const std::vector<std::string> want = {"prog",           "--samples", "--samples", "--haystack-dir=dir/x",
                                         "--num_samplesx", "3",         "--",        "--num_samples"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(alias_note(t, "--samples"), " (EasyContext: --num_samples)");
  EXPECT_EQ(alias_note(t, "--digits"), "");
}

TEST(CliAlias, ModeNamesAndRingDegree) {
  EXPECT_EQ(canonical_sp_mode_name("zigzag_ring_attn"), "zigzag_ring");
  EXPECT_EQ(canonical_sp_mode_name("data_parallel"), "none");
  EXPECT_EQ(canonical_sp_mode_name("usp"), "usp");
  for (const auto& [ec, ours] :
       std::vector<std::pair<std::string, SeqParallelMode>>{{"zigzag_ring_attn", SeqParallelMode::ZigzagRing},
                                                            {"ulysses_attn", SeqParallelMode::Ulysses},
                                                            {"dist_flash_attn", SeqParallelMode::DistFlash},
                                                            {"usp_attn", SeqParallelMode::Usp},
                                                            {"data_parallel", SeqParallelMode::None}}) {
    const StageConfig c = parse_stage_config("parallel:\n  sequence:\n    mode: " + ec + "\n", "t.yaml");
    EXPECT_EQ(c.parallel.sequence.mode, ours) << ec;
    EXPECT_NE(dump_stage_config(c).find(std::string("mode: ") + to_string(ours) + "\n"), std::string::npos) << ec;
  }
  // Keys in any order: ring_degree before size.
  const StageConfig c =
      parse_stage_config("parallel:\n  sequence:\n    ring_degree: 4\n    mode: usp_attn\n    size: 16\n", "t.yaml");
  EXPECT_EQ(c.parallel.sequence.ulysses_size, 4);
  const StageConfig d = parse_stage_config("parallel:\n  sequence:\n    mode: usp\n    size: 16\n", "t.yaml",
                                           {"parallel.sequence.ring_degree=2"});
  EXPECT_EQ(d.parallel.sequence.ulysses_size, 8);
  EXPECT_THROW(parse_stage_config("parallel:\n  sequence:\n    mode: usp\n    size: 6\n    ring_degree: 4\n", "t"),
               InputError);
  EXPECT_THROW(parse_stage_config("parallel:\n  sequence:\n    mode: ulysses\n    size: 4\n    ring_degree: 2\n", "t"),
               InputError);
}
