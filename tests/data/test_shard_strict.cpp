// Token shards read strictly (issue 53): what the reader, the dataset, the loader and
// `h5inspect --scan` accept of a shard someone rewrote. A loss weight other than 0 or 1 is
// refused naming the file and the first offending index (it trained as a weight of 1, and
// h5inspect said OK); a format_version 1 shard that carries /loss_weights is refused naming the
// file (its weights were ignored: prompts trained); string attributes rewritten as
// variable-length strings (what h5py writes) read as the fixed-length ones h5tokenize writes,
// and a string attribute of another shape or type is refused saying what was found and expected
// (it was "H5Aread failed").
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "core/error.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data_test_util.h"
#include "test_util.h"

using easyctx::test::input_error_of;
using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// A shard of `docs` random documents with random 0/1 loss weights (each document has a 1);
// returns the weights as written.
std::vector<uint8_t> write_weighted_shard(const std::string& path, std::mt19937_64& rng, int docs) {
  ShardMeta meta;
  meta.tokenizer_name = "synthetic";
  meta.tokenizer_sha256 = std::string(64, 'a');
  meta.vocab_size = 100;
  meta.has_loss_weights = true;
  TokenShardWriter w(path, meta, 64);
  const uint16_t src = w.source_index("chat");
  std::vector<uint8_t> all;
  for (int d = 0; d < docs; ++d) {
    const size_t n = 4 + rng() % 60;
    std::vector<uint32_t> ids(n);
    std::vector<uint8_t> wt(n);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = static_cast<uint32_t>(rng() % 100);
      wt[i] = static_cast<uint8_t>(rng() % 2);
    }
    wt[n - 1] = 1;
    w.add_document(ids.data(), n, src, wt.data());
    all.insert(all.end(), wt.begin(), wt.end());
  }
  w.commit();
  return all;
}

hid_t open_rw(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(f, 0) << path;
  return f;
}

// Writes `value` at index `at` of the shard's /loss_weights.
void poke_weight(const std::string& path, uint64_t at, uint8_t value) {
  hid_t f = open_rw(path);
  hid_t ds = H5Dopen2(f, "loss_weights", H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  hid_t fs = H5Dget_space(ds);
  hsize_t start[1] = {at}, one[1] = {1};
  ASSERT_GE(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, one, nullptr), 0);
  hid_t ms = H5Screate_simple(1, one, nullptr);
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT8, ms, fs, H5P_DEFAULT, &value), 0);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(ds);
  H5Fclose(f);
}

// Rewrites string attribute `name` as h5py does: a scalar variable-length UTF-8 string.
void make_variable_length(const std::string& path, const char* name) {
  hid_t f = open_rw(path);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  hid_t ft = H5Aget_type(a);
  std::string value(H5Tget_size(ft) + 1, '\0');
  hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_size(mt, value.size());
  H5Tset_cset(mt, H5Tget_cset(ft));
  ASSERT_GE(H5Aread(a, mt, value.data()), 0);
  value.resize(std::strlen(value.c_str()));
  H5Tclose(mt);
  H5Tclose(ft);
  H5Aclose(a);
  ASSERT_GE(H5Adelete(f, name), 0);
  hid_t vt = H5Tcopy(H5T_C_S1);
  H5Tset_size(vt, H5T_VARIABLE);
  H5Tset_cset(vt, H5T_CSET_UTF8);
  hid_t space = H5Screate(H5S_SCALAR);
  a = H5Acreate2(f, name, vt, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  const char* p = value.c_str();
  ASSERT_GE(H5Awrite(a, vt, &p), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(vt);
  H5Fclose(f);
}

// Replaces attribute `name` by a 1-D array of two variable-length strings.
void make_string_array(const std::string& path, const char* name) {
  hid_t f = open_rw(path);
  ASSERT_GE(H5Adelete(f, name), 0);
  hid_t vt = H5Tcopy(H5T_C_S1);
  H5Tset_size(vt, H5T_VARIABLE);
  hsize_t two[1] = {2};
  hid_t space = H5Screate_simple(1, two, nullptr);
  hid_t a = H5Acreate2(f, name, vt, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  const char* v[2] = {"x", "y"};
  ASSERT_GE(H5Awrite(a, vt, v), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(vt);
  H5Fclose(f);
}

// The ways a shard is read: the reader (and its weights), the dataset, a packed loader.
std::vector<std::function<void()>> readers(const std::string& path) {
  return {[path] {
            TokenShardReader r(path);
            std::vector<uint8_t> w(r.num_tokens());
            r.read_weights(0, w.size(), w.data());
          },
          [path] {
            TokenDataset ds(path);
            std::vector<uint8_t> w(ds.num_tokens());
            ds.read_weights(0, w.size(), w.data());
          },
          [path] {
            LoaderOptions o;
            o.path = path;
            o.seq_length = 16;
            o.packing = DataPacking::BestFit;
            DataLoader l(o);
          }};
}

}  // namespace

// A weight other than 0 or 1 at a random place (a random value 2..255): refused by every way
// of reading, naming the file and the index; the same shard with the weight put back reads.
TEST(ShardStrict, LossWeightsAreZeroOrOne) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("weights");
  const std::string path = dir / "w.h5";
  const std::vector<uint8_t> w = write_weighted_shard(path, rng, 30);
  const uint64_t at = rng() % w.size();
  const int bad = 2 + static_cast<int>(rng() % 254);
  poke_weight(path, at, static_cast<uint8_t>(bad));
  const std::string want =
      path + ": /loss_weights[" + std::to_string(at) + "] is " + std::to_string(bad) + ", expected 0 or 1";
  for (const auto& read : readers(path)) {
    const std::string e = input_error_of(read);
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  poke_weight(path, at, w[at]);
  for (const auto& read : readers(path)) EXPECT_EQ(input_error_of(read), "");
}

// format_version 1 promises no weights: a /loss_weights beside it (written by hand, or a
// version-2 shard whose attribute was rewritten) is refused, never ignored.
TEST(ShardStrict, Version1ShardWithLossWeightsIsRefused) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("v1weights");
  const std::string path = dir / "v1.h5";
  write_weighted_shard(path, rng, 12);
  hid_t f = open_rw(path);
  ASSERT_GE(H5Adelete(f, "format_version"), 0);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, "format_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const int64_t v1 = 1;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v1), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Fclose(f);
  for (const auto& read : readers(path)) {
    const std::string e = input_error_of(read);
    EXPECT_NE(e.find(path + ": format_version 1 with a /loss_weights dataset"), std::string::npos) << e;
  }
}

// Every string attribute as h5py rewrites it (variable length): the same metadata; an array of
// strings or a number where a string belongs is refused saying what was found and expected.
TEST(ShardStrict, VariableLengthStringAttributesRead) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("vlen");
  const std::string path = dir / "s.h5";
  write_weighted_shard(path, rng, 8);
  const ShardMeta before = read_shard_meta(path);
  for (const char* name : {"format", "tokenizer_sha256", "tokenizer_name", "easyctx_version"})
    make_variable_length(path, name);
  const ShardMeta after = read_shard_meta(path);
  EXPECT_EQ(after.tokenizer_sha256, before.tokenizer_sha256);
  EXPECT_EQ(after.tokenizer_name, before.tokenizer_name);
  EXPECT_EQ(after.easyctx_version, before.easyctx_version);
  EXPECT_EQ(input_error_of([&] { TokenDataset ds(path); }), "");
  make_string_array(path, "tokenizer_name");
  std::string e = input_error_of([&] { TokenShardReader r(path); });
  EXPECT_NE(e.find(path + ": attribute tokenizer_name holds 2 strings, expected one string"), std::string::npos) << e;
  hid_t f = open_rw(path);
  ASSERT_GE(H5Adelete(f, "tokenizer_name"), 0);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, "tokenizer_name", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const int64_t x = static_cast<int64_t>(rng() % 1000);
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &x), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Fclose(f);
  e = input_error_of([&] { TokenShardReader r(path); });
  EXPECT_NE(e.find(path + ": attribute tokenizer_name holds int64, expected a string"), std::string::npos) << e;
}

// h5inspect reads every weight, with and without --scan: a bad one ends it (exit 2) naming the
// file and index, where it printed the weights' sum and "OK".
TEST(ShardStrict, H5inspectRefusesBadWeights) {
  const std::string h5inspect = easyctx::test::bin_dir() + "/h5inspect";
  ASSERT_TRUE(fs::exists(h5inspect)) << "h5inspect is not built (the test depends on it)";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("inspect-weights");
  const std::string path = dir / "w.h5";
  const std::vector<uint8_t> w = write_weighted_shard(path, rng, 20);
  const uint64_t at = rng() % w.size();
  poke_weight(path, at, static_cast<uint8_t>(2 + rng() % 254));
  for (const char* flags : {" --scan", ""}) {
    const auto r = easyctx::test::run_command(h5inspect + flags + " " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(path + ": /loss_weights[" + std::to_string(at) + "] is "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("OK"), std::string::npos) << r.output;
  }
}
