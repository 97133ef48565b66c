// Overflow-checked size arithmetic (core/checked.h): against 128-bit references on fresh
// random operands, and the messages name what overflowed.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "core/checked.h"
#include "core/config.h"
#include "test_util.h"

using easyctx::test::input_error_of;

using namespace easyctx;

namespace {

// Operands spread over every magnitude: a random bit width, then a random value of it.
int64_t draw(std::mt19937_64& rng) {
  const int bits = static_cast<int>(rng() % 64);
  const int64_t v = bits == 0 ? 0 : static_cast<int64_t>(rng() >> (64 - bits));
  return rng() % 2 ? v : -v;
}

}  // namespace

TEST(Checked, MulAndAddAgreeWith128BitArithmetic) {
  std::mt19937_64 rng(test::test_seed());
  int overflows = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t a = draw(rng), b = draw(rng);
    const __int128 p = static_cast<__int128>(a) * b, s = static_cast<__int128>(a) + b;
    const bool p_fits = p >= INT64_MIN && p <= INT64_MAX, s_fits = s >= INT64_MIN && s <= INT64_MAX;
    if (p_fits) {
      EXPECT_EQ(checked_mul(a, b, "m"), static_cast<int64_t>(p)) << a << " x " << b;
    } else {
      ++overflows;
      const std::string e = input_error_of([&] { checked_mul(a, b, "the thing"); });
      EXPECT_NE(e.find("the thing: " + std::to_string(a) + " x " + std::to_string(b) + " overflows"), std::string::npos)
          << e;
    }
    if (s_fits) EXPECT_EQ(checked_add(a, b, "s"), static_cast<int64_t>(s));
    else EXPECT_NE(input_error_of([&] { checked_add(a, b, "sum"); }).find("sum: "), std::string::npos);
    const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    const unsigned __int128 up = static_cast<unsigned __int128>(ua) * ub;
    if (up >> 64) EXPECT_THROW(checked_mul(ua, ub, "u"), InputError);
    else EXPECT_EQ(checked_mul(ua, ub, "u"), static_cast<uint64_t>(up));
  }
  EXPECT_GT(overflows, 1000);  // the draw reaches both sides
}

TEST(Checked, ProductsAndElementCounts) {
  std::mt19937_64 rng(test::test_seed());
  for (int i = 0; i < 2000; ++i) {
    const int64_t a = static_cast<int64_t>(rng() % (int64_t{1} << 26)),
                  b = static_cast<int64_t>(rng() % (int64_t{1} << 26)), c = static_cast<int64_t>(rng() % 64);
    const __int128 p = static_cast<__int128>(a) * b * c;
    if (p <= kMaxElements) {
      EXPECT_EQ(checked_elements({a, b, c}, "e"), static_cast<int64_t>(p));
    } else {
      const std::string e = input_error_of([&] { checked_elements({a, b, c}, "activations"); });
      EXPECT_NE(e.find("activations: " + std::to_string(a) + " x " + std::to_string(b)), std::string::npos) << e;
      EXPECT_NE(e.find("2^50"), std::string::npos) << e;
    }
  }
  // 2^57 x 64 x 3 (the intermediate_size) overflows a product of int64 outright.
  const std::string e = input_error_of([] { checked_product({3, 64, int64_t{1} << 57}, "parameters"); });
  EXPECT_NE(e.find("parameters: 3 x 64 x 144115188075855872 overflows"), std::string::npos) << e;
  EXPECT_NE(input_error_of([] { checked_elements({-1, 5}, "neg"); }).find("negative"), std::string::npos);
}

// Sizes derived from several stage keys: each overflow names the keys it came from.
TEST(Checked, StageSizesNameTheirKeys) {
  auto err = [](const std::vector<std::string>& sets, int world = 1) {
    return input_error_of([&] { validate_for_world(parse_stage_config("", "s.yaml", sets), world); });
  };
  std::mt19937_64 rng(test::test_seed());
  const int64_t big = (int64_t{1} << 50) + static_cast<int64_t>(rng() % (int64_t{1} << 40));
  std::string e = err({"train.batch_size=" + std::to_string(big)});
  EXPECT_NE(e.find("s.yaml: tokens per micro-batch, train.batch_size x (data.seq_length + 1)"), std::string::npos) << e;
  e = err({"train.grad_accum=" + std::to_string(big), "train.batch_size=1048576"});
  EXPECT_NE(e.find("train.batch_size x train.grad_accum"), std::string::npos) << e;
  e = err({"train.steps=" + std::to_string(big), "train.batch_size=64"});
  EXPECT_NE(e.find("tokens of the run, (train.steps + 1)"), std::string::npos) << e;
  e = err({"train.steps=9223372036854775807"});
  EXPECT_NE(e.find("train.steps + 1"), std::string::npos) << e;
  e = input_error_of([] { parse_stage_config("data:\n  seq_length: 1073741825\n", "s.yaml"); });
  EXPECT_NE(e.find("s.yaml:2:15: data.seq_length: bad value '1073741825': expected an integer in [2, 1073741824]"),
            std::string::npos)
      << e;
  EXPECT_EQ(err({"data.seq_length=1073741824", "train.batch_size=1024", "train.steps=1000"}), "");
}
