// Group layout arithmetic (no MPI): contiguous SP groups, strided DP groups, usp split.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"
#include "dist/groups.h"

using namespace easyctx;

TEST(GroupLayout, DataTimesSequence) {
  StageConfig c;
  c.parallel.sequence.size = 2;  // default mode: zigzag_ring
  auto L = dist::make_group_layout(c, 4, 4);
  EXPECT_EQ(L.dp_size, 2);
  EXPECT_EQ(L.sp_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(L.dp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(L.ring_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  std::string d = L.describe();
  EXPECT_NE(d.find("2 data-parallel x 2 sequence-parallel"), std::string::npos) << d;
  EXPECT_NE(d.find("[0 1] [2 3]"), std::string::npos) << d;
  EXPECT_NE(d.find("[0 2] [1 3]"), std::string::npos) << d;
}

TEST(GroupLayout, UspSplitsUlyssesInsideRingAcross) {
  StageConfig c;
  c.parallel.sequence.mode = SeqParallelMode::Usp;
  c.parallel.sequence.size = 8;
  c.parallel.sequence.ulysses_size = 4;
  auto L = dist::make_group_layout(c, 16, 8);
  EXPECT_EQ(L.ulysses_size, 4);
  EXPECT_EQ(L.ring_size, 2);
  EXPECT_EQ(L.ulysses_groups()[1], (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(L.ring_groups()[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(L.ring_groups()[5], (std::vector<int>{9, 13}));
  // Every rank is in exactly one group of each kind.
  for (auto groups : {L.sp_groups(), L.dp_groups(), L.ulysses_groups(), L.ring_groups(), L.zero_groups()}) {
    std::vector<int> seen(16, 0);
    for (auto& g : groups)
      for (int r : g) seen[static_cast<size_t>(r)]++;
    for (int s : seen) EXPECT_EQ(s, 1);
  }
  c.parallel.sequence.ulysses_size = 0;  // default: ranks per node, dividing the group
  EXPECT_EQ(dist::make_group_layout(c, 16, 4).ulysses_size, 4);
}

TEST(GroupLayout, ZeroPerNode) {
  StageConfig c;
  c.parallel.zero.stage = 3;
  c.parallel.zero.group = ZeroGroupScope::Node;
  auto L = dist::make_group_layout(c, 8, 4);
  EXPECT_EQ(L.zero_groups(), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(L.zero_replica_groups()[1], (std::vector<int>{1, 5}));
  EXPECT_THROW(dist::make_group_layout(c, 6, 4), InputError);
}

TEST(GroupLayout, RejectsSizesThatDoNotDivide) {
  StageConfig c;
  c.parallel.sequence.mode = SeqParallelMode::Ulysses;
  c.parallel.sequence.size = 3;
  EXPECT_THROW(dist::make_group_layout(c, 4, 4), InputError);
  c.parallel.sequence.mode = SeqParallelMode::None;
  c.parallel.sequence.size = 2;
  EXPECT_THROW(dist::make_group_layout(c, 4, 4), InputError);
}
