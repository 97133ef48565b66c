// Strict shard inputs: element types (a float, signed or narrower /tokens is refused naming
// the file and the type; negative ids never become 0) and overflow-checked sizes.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "data_test_util.h"
#include "test_util.h"

using easyctx::test::input_error_of;

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Replaces dataset `name` of a shard with one of file type `type` holding `values` (as
// int64, converted by HDF5; a float type gets the same numbers).
void retype_dataset(const std::string& path, const char* name, hid_t type, const std::vector<int64_t>& values) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, name, H5P_DEFAULT), 0);
  hsize_t dims[1] = {values.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t ds = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  if (!values.empty()) { ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0); }
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
}

void retype_attr(const std::string& path, const char* name, double value) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete(f, name), 0);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Fclose(f);
}

}  // namespace

// /tokens of every integer and float type but uint32 (and a big-endian uint32, which is the
// same numbers): refused by the reader, the dataset and the loader, naming the file and type.
// Signed shards hold fresh random negative ids: they must never read as 0.
TEST(DataStrict, TokenDtypeIsChecked) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("dtype");
  const std::vector<std::pair<hid_t, std::string>> refused = {
      {H5T_IEEE_F32LE, "float32"}, {H5T_IEEE_F64LE, "float64"}, {H5T_STD_I8LE, "int8"},  {H5T_STD_I16LE, "int16"},
      {H5T_STD_I32LE, "int32"},    {H5T_STD_I64LE, "int64"},    {H5T_STD_U8LE, "uint8"}, {H5T_STD_U16LE, "uint16"},
      {H5T_STD_U64LE, "uint64"},   {H5T_STD_I32BE, "int32"}};
  int cases = 0;
  for (const auto& [type, name] : refused) {
    const std::string path = dir / ("s-" + name + std::to_string(cases) + ".h5");
    const std::vector<uint32_t> tokens = easyctx::test::write_random_shard(path, rng, 5, 40, 100);
    std::vector<int64_t> values(tokens.begin(), tokens.end());
    const bool is_signed = name.rfind("int", 0) == 0;
    if (is_signed)
      for (int k = 0; k < 5; ++k) values[rng() % values.size()] = -1 - static_cast<int64_t>(rng() % 100);
    retype_dataset(path, "tokens", type, values);
    for (const auto& open :
         std::vector<std::function<void()>>{[&] { TokenShardReader r(path); }, [&] { TokenDataset ds(path); },
                                            [&] {
                                              LoaderOptions o;
                                              o.path = path;
                                              o.seq_length = 8;
                                              DataLoader l(o);
                                            }}) {
      const std::string e = input_error_of(open);
      EXPECT_NE(e.find(path + ": dataset /tokens holds " + name + ", expected uint32"), std::string::npos) << e;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 10);
  // A big-endian uint32 dataset is the same numbers: accepted, ids intact.
  const std::string be = dir / "be.h5";
  const std::vector<uint32_t> tokens = easyctx::test::write_random_shard(be, rng, 5, 40, 100);
  retype_dataset(be, "tokens", H5T_STD_U32BE, std::vector<int64_t>(tokens.begin(), tokens.end()));
  TokenShardReader r(be);
  EXPECT_EQ(r.read(0, r.num_tokens()), tokens);
  // The index datasets and the integer attributes are checked too.
  const std::string off = dir / "off.h5";
  easyctx::test::write_random_shard(off, rng, 5, 40, 100);
  std::vector<int64_t> offsets;
  {
    TokenShardReader ro(off);
    offsets.assign(ro.doc_offsets().begin(), ro.doc_offsets().end());
  }
  retype_dataset(off, "doc_offsets", H5T_STD_I64LE, offsets);
  EXPECT_NE(input_error_of([&] { TokenShardReader x(off); }).find("dataset /doc_offsets holds int64, expected uint64"),
            std::string::npos);
  const std::string src = dir / "src.h5";
  easyctx::test::write_random_shard(src, rng, 5, 40, 100);
  std::vector<int64_t> sources;
  {
    TokenShardReader rs(src);
    sources.assign(rs.doc_source().begin(), rs.doc_source().end());
  }
  retype_dataset(src, "doc_source", H5T_IEEE_F32LE, sources);
  EXPECT_NE(input_error_of([&] { TokenShardReader x(src); }).find("dataset /doc_source holds float32, expected uint16"),
            std::string::npos);
  const std::string attr = dir / "attr.h5";
  easyctx::test::write_random_shard(attr, rng, 5, 40, 100);
  retype_attr(attr, "vocab_size", 100.7);
  EXPECT_NE(input_error_of([&] {
              TokenShardReader x(attr);
            }).find(attr + ": attribute vocab_size holds float64, expected an integer"),
            std::string::npos);
}

// Sample indices (step x global batch) are checked, not wrapped.
TEST(DataStrict, SampleIndexOverflowIsAnError) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  BatchShape s{1 + static_cast<int64_t>(rng() % 8), 1, 1};
  EXPECT_EQ(sample_index(s, 3, 0, 0, 0), static_cast<uint64_t>(3 * s.batch_size));
  const std::string e = input_error_of([&] { sample_index({int64_t{1} << 40, 1, 1}, int64_t{1} << 40, 0, 0, 0); });
  EXPECT_NE(e.find("sample index, step x global batch"), std::string::npos) << e;
}
