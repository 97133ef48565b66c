// Strict inputs through the data tools: h5inspect (with --scan) refuses a shard whose /tokens
// is not uint32, naming the file and the type (it passed int32 shards with negative ids);
// h5tokenize gives a long one-line document the ids of the whole text (tokenized in pieces)
// and refuses one above --max-doc-bytes naming the file and line.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <random>

#include "core/strings.h"
#include "data/shard.h"
#include "data/tokenize/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

std::string tool(const char* name) { return easyctx::test::bin_dir() + "/" + name; }

}  // namespace

TEST(DataToolsStrict, H5inspectRefusesSignedTokens) {
  ASSERT_TRUE(fs::exists(tool("h5inspect"))) << "h5inspect is not built (the test depends on it)";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("inspect-dtype");
  const std::string path = dir / "s.h5";
  const std::vector<uint32_t> tokens = easyctx::test::write_random_shard(path, rng, 6, 50, 100);
  std::vector<int32_t> values(tokens.begin(), tokens.end());
  for (int k = 0; k < 4; ++k) values[rng() % values.size()] = -1 - static_cast<int32_t>(rng() % 50);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "tokens", H5P_DEFAULT), 0);
  hsize_t dims[1] = {values.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t ds = H5Dcreate2(f, "tokens", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
  for (const char* flags : {" --scan", ""}) {
    const auto r = easyctx::test::run_command(tool("h5inspect") + flags + " " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(path + ": dataset /tokens holds int32, expected uint32"), std::string::npos) << r.output;
  }
}

TEST(DataToolsStrict, H5tokenizeLongLineInPiecesAndTheLimit) {
  ASSERT_TRUE(fs::exists(tool("h5tokenize"))) << "h5tokenize is not built (the test depends on it)";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("long-line");
  std::vector<std::string> toks;
  const auto demo = easyctx::test::run_command(easyctx::test::source_dir() + "/scripts/make_demo_tokenizer.sh " +
                                               dir.path() + "/demo 2>/dev/null");
  if (demo.status == 0 && fs::exists(dir / "demo/kjv_bpe2000.model")) toks.push_back(dir / "demo/kjv_bpe2000.model");
  const std::string l2 = easyctx::test::shared_fixture("tokenizers/llama2/tokenizer.model");
  if (fs::exists(l2)) toks.push_back(l2);
  if (toks.empty()) GTEST_SKIP() << "no SentencePiece tokenizer: spm_train/bible missing and no Llama 2 fixture";
  // About 1.5 MB of words, spaces, digits and newlines on one JSON line: several 256 KiB pieces.
  static const char* words[] = {"the", "of", "And", "lord", "said", "unto", "1", "23", "it's", "\\n", "  ", "é"};
  std::string text;
  while (text.size() < (3u << 19)) text += std::string(words[rng() % 12]) + (rng() % 4 ? " " : "");
  easyctx::test::write_text(dir / "long.jsonl", "{\"text\": \"short one\"}\n{\"text\": \"" + text + "\"}\n");
  std::string plain;  // the JSON string's value
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') plain += '\n', ++i;
    else plain += text[i];
  }
  for (const std::string& t : toks) {
    const std::string out = dir / ("out-" + std::to_string(&t - toks.data()));
    auto r = easyctx::test::run_command(tool("h5tokenize") + " -t " + t + " -o " + out + " " + dir / "long.jsonl");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto tok = data::load_tokenizer(t);
    std::vector<uint32_t> want{static_cast<uint32_t>(tok->bos_id())};
    tok->encode(plain, want);  // the whole text at once
    data::TokenShardReader shard(out + "/shard-000000-0000.h5");
    ASSERT_EQ(shard.num_docs(), 2u);
    const uint64_t b = shard.doc_offsets()[1], e = shard.doc_offsets()[2];
    EXPECT_EQ(shard.read(b, e - b), want) << t;
    r = easyctx::test::run_command(tool("h5tokenize") + " -t " + t + " -o " + out + "-cap --max-doc-bytes 100000 " +
                                   dir / "long.jsonl");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(dir / "long.jsonl:2: a line longer than --max-doc-bytes 100000"), std::string::npos)
        << r.output;
  }
}
