// Token shards, dataset, sampler, sequence-parallel slicing and the loader (easyctx_data).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "core/error.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sha256.h"
#include "data/shard.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;

TEST(DataSha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a' fed in random-sized pieces (exercises the block buffering).
  std::mt19937_64 rng(easyctx::test::test_seed());
  Sha256 h;
  std::string a(1000000, 'a');
  size_t pos = 0;
  while (pos < a.size()) {
    size_t n = std::min<size_t>(a.size() - pos, rng() % 200);
    h.update(a.data() + pos, n);
    pos += n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(DataShard, WriteReadRoundTrip) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("shard");
  auto tokens = easyctx::test::write_random_shard(dir / "a.h5", rng, 50 + rng() % 50, 300, 50000);
  TokenShardReader r(dir / "a.h5");
  ASSERT_EQ(r.num_tokens(), tokens.size());
  EXPECT_EQ(r.read(0, tokens.size()), tokens);
  uint64_t off = rng() % tokens.size();
  uint64_t n = rng() % (tokens.size() - off);
  EXPECT_EQ(r.read(off, n), std::vector<uint32_t>(tokens.begin() + off, tokens.begin() + off + n));
  EXPECT_EQ(r.meta().vocab_size, 50000);
  EXPECT_EQ(r.meta().bos_id, 1);
  EXPECT_EQ(r.meta().easyctx_version, EASYCTX_VERSION);
  EXPECT_EQ(r.doc_offsets().back(), tokens.size());
  EXPECT_LE(r.sources().size(), 3u);
  EXPECT_THROW(r.read(tokens.size() - 1, 2), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "a.h5.tmp"));
}

TEST(DataShard, UncommittedWriterLeavesNoFile) {
  ScratchDir dir("shard-tmp");
  {
    ShardMeta m;
    m.vocab_size = 10;
    TokenShardWriter w(dir / "x.h5", m);
    uint32_t ids[3] = {1, 2, 3};
    w.add_document(ids, 3, w.source_index("s"));
    uint32_t bad = 10;
    EXPECT_THROW(w.add_document(&bad, 1, 0), Error);  // id >= vocab
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "x.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir / "x.h5.tmp"));
}

TEST(DataShard, RejectsNonShardFiles) {
  ScratchDir dir("notshard");
  easyctx::test::write_text(dir / "text.h5", "not hdf5 at all");
  try {
    TokenShardReader r(dir / "text.h5");
    FAIL() << "expected an error";
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("text.h5"), std::string::npos) << e.what(); }
  hid_t f = H5Fcreate((dir / "empty.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Fclose(f);
  EXPECT_THROW(TokenShardReader(dir / "empty.h5"), InputError);
}

TEST(DataDataset, ConcatenatesFilesSortedByName) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("dataset");
  // Written out of order on purpose; the dataset must sort by name.
  auto b = easyctx::test::write_random_shard(dir / "shard-b.h5", rng, 20, 100, 1000);
  auto a = easyctx::test::write_random_shard(dir / "shard-a.h5", rng, 20, 100, 1000);
  auto c = easyctx::test::write_random_shard(dir / "shard-c.h5", rng, 20, 100, 1000);
  easyctx::test::write_text(dir / "shard-d.h5.tmp", "partial");  // ignored
  std::vector<uint32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  for (const std::string& spec : {dir.path(), dir / "shard-*.h5"}) {
    TokenDataset ds(spec, 2);  // 2 open files: forces the LRU to reopen
    ASSERT_EQ(ds.num_files(), 3u);
    ASSERT_EQ(ds.num_tokens(), all.size());
    for (int trial = 0; trial < 20; ++trial) {
      uint64_t off = rng() % all.size();
      uint64_t n = 1 + rng() % std::min<uint64_t>(all.size() - off, 250);
      std::vector<uint32_t> got(n);
      ds.read(off, n, got.data());
      ASSERT_TRUE(std::equal(got.begin(), got.end(), all.begin() + off)) << "offset " << off << " n " << n;
    }
  }
  EXPECT_THROW(TokenDataset(dir / "nothing-*.h5"), InputError);
}

TEST(DataDataset, ValidateAgainstModel) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("validate");
  std::string sha = sha256_hex("tokenizer " + std::to_string(rng()));
  easyctx::test::write_random_shard(dir / "s.h5", rng, 10, 50, 1000, sha);
  TokenDataset ds(dir / "s.h5");
  EXPECT_NO_THROW(ds.validate(1000, sha, true));
  EXPECT_NO_THROW(ds.validate(1024));  // a padded model vocab is fine
  try {
    ds.validate(999);
    FAIL();
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what(); }
  try {
    ds.validate(1000, std::string(64, 'f'));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(64, 'f')), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s.h5"), std::string::npos) << e.what();
  }
  // Shards of different tokenizers cannot form one dataset.
  easyctx::test::write_random_shard(dir / "t.h5", rng, 10, 50, 1000, sha256_hex("other"));
  EXPECT_THROW(TokenDataset(dir.path()), InputError);
}

// Lowers the stored vocab_size attribute below the largest id (a corrupt or mislabelled
// shard) so only the per-window check can catch it.
static void relabel_vocab(const std::string& path, int64_t vocab) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, "vocab_size", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &vocab), 0);
  H5Aclose(a);
  H5Fclose(f);
}

TEST(DataLoader, RejectsIdsAboveVocab) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("badids");
  auto tokens = easyctx::test::write_random_shard(dir / "s.h5", rng, 40, 200, 5000);
  relabel_vocab(dir / "s.h5", 100);  // nearly every window now holds an id >= 100
  LoaderOptions o;
  o.path = dir / "s.h5";
  o.seq_length = 64;
  o.seed = rng();
  DataLoader loader(o);
  try {
    loader.next();
    FAIL() << "ids >= vocab were not rejected";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("s.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocab size 100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(loader.validate(100, "", true), InputError);
  o.check_tokens = false;  // data.check_tokens: false skips the per-window check
  DataLoader unchecked(o);
  EXPECT_NO_THROW(unchecked.next());
}

TEST(DataSampler, PermutationIsABijection) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    uint64_t n = 1 + rng() % 5000;
    Permutation p(n, rng());
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t y = p(i);
      ASSERT_LT(y, n);
      ASSERT_FALSE(seen[y]) << "n " << n << " collision at " << i;
      seen[y] = true;
    }
  }
  // Not the identity, and the key matters.
  Permutation p(1000, 1), q(1000, 2);
  int fixed = 0, same = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    fixed += p(i) == i;
    same += p(i) == q(i);
  }
  EXPECT_LT(fixed, 20);
  EXPECT_LT(same, 20);
}

TEST(DataSampler, WindowsArePureAndCoverEachEpoch) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  uint64_t T = 1000 + rng() % 100000;
  int64_t L = 1 + static_cast<int64_t>(rng() % 500);
  uint64_t seed = rng();
  WindowSampler s(T, L, seed), s2(T, L, seed), other(T, L, seed + 1);
  uint64_t N = s.windows_per_epoch();
  ASSERT_EQ(N, (T - 1) / L);
  std::set<uint64_t> epoch0, epoch1;
  int differ = 0, differ_epoch = 0;
  for (uint64_t i = 0; i < N; ++i) {
    uint64_t w = s.window_start(i);
    ASSERT_EQ(w % L, 0u);
    ASSERT_LE(w + L + 1, T);
    ASSERT_EQ(w, s2.window_start(i));
    epoch0.insert(w);
    epoch1.insert(s.window_start(N + i));
    differ += w != other.window_start(i);
    differ_epoch += w != s.window_start(N + i);
  }
  EXPECT_EQ(epoch0.size(), N);  // every window once per epoch
  EXPECT_EQ(epoch1.size(), N);
  if (N > 20) {
    EXPECT_GT(differ, 0) << "seed has no effect";
    EXPECT_GT(differ_epoch, 0) << "every epoch has the same order";
  }
  EXPECT_THROW(WindowSampler(10, 10, 0), InputError);
}

TEST(DataSampler, SampleIndexLayout) {
  BatchShape s{3, 2, 4};
  std::set<uint64_t> all;
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t p = 0; p < 4; ++p)
      for (int64_t b = 0; b < 3; ++b) all.insert(sample_index(s, 5, m, p, b));
  EXPECT_EQ(all.size(), 24u);
  EXPECT_EQ(*all.begin(), 5u * 24);
  EXPECT_EQ(*all.rbegin(), 6u * 24 - 1);
  EXPECT_EQ(sample_index(s, 0, 1, 2, 1), uint64_t((1 * 4 + 2) * 3 + 1));
}

// Global batch of one step as a multiset of windows, from every (dp_rank, micro).
static std::multiset<std::vector<int32_t>> global_batch(const std::string& path, uint64_t seed, int64_t L,
                                                        BatchShape shape, int64_t step) {
  std::multiset<std::vector<int32_t>> out;
  for (int64_t p = 0; p < shape.dp_size; ++p) {
    LoaderOptions o;
    o.path = path;
    o.seq_length = L;
    o.seed = seed;
    o.shape = shape;
    o.dp_rank = p;
    DataLoader loader(o);
    for (int64_t m = 0; m < shape.grad_accum; ++m) {
      MicroBatch mb = loader.micro_batch(step, m);
      EXPECT_EQ(mb.local_len, L);
      for (int64_t b = 0; b < mb.batch; ++b) {
        std::vector<int32_t> seq(mb.tokens.begin() + b * L, mb.tokens.begin() + (b + 1) * L);
        seq.push_back(mb.labels[(b + 1) * L - 1]);
        out.insert(seq);
      }
    }
  }
  return out;
}

TEST(DataLoader, SameGlobalBatchForDpAndAccumLayouts) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("dpaccum");
  easyctx::test::write_random_shard(dir / "s.h5", rng, 300, 400, 32000);
  const int64_t L = 16 + rng() % 100;
  const uint64_t seed = rng();
  for (int64_t step : {int64_t(0), int64_t(1), int64_t(7 + rng() % 20)}) {
    auto a = global_batch(dir / "s.h5", seed, L, BatchShape{2, 4, 1}, step);
    auto b = global_batch(dir / "s.h5", seed, L, BatchShape{2, 1, 4}, step);
    auto c = global_batch(dir / "s.h5", seed, L, BatchShape{2, 2, 2}, step);
    EXPECT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b) << "step " << step;
    EXPECT_EQ(a, c) << "step " << step;
    auto other = global_batch(dir / "s.h5", seed + 1, L, BatchShape{2, 4, 1}, step);
    EXPECT_NE(a, other) << "seed has no effect";
  }
}

TEST(DataLoader, WindowMatchesStreamAndLabelsShift) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("window");
  auto tokens = easyctx::test::write_random_shard(dir / "s.h5", rng, 100, 300, 32000);
  LoaderOptions o;
  o.path = dir / "s.h5";
  o.seq_length = 10 + rng() % 200;
  o.seed = rng();
  o.shape = {3, 1, 1};
  DataLoader loader(o);
  MicroBatch mb = loader.next();
  const int64_t L = o.seq_length;
  for (int64_t b = 0; b < 3; ++b) {
    uint64_t start = loader.sampler().window_start(mb.sample_ids[b]);
    for (int64_t t = 0; t < L; ++t) {
      ASSERT_EQ(mb.tokens[b * L + t], static_cast<int32_t>(tokens[start + t]));
      ASSERT_EQ(mb.labels[b * L + t], static_cast<int32_t>(tokens[start + t + 1]));
      ASSERT_EQ(mb.positions[b * L + t], t);
    }
  }
  EXPECT_EQ(mb.real_labels, 3 * L);
}

TEST(DataSlice, ZigzagAndContiguousReassemble) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  for (int trial = 0; trial < 30; ++trial) {
    const int W = 1 + static_cast<int>(rng() % 6);
    const int64_t L = 1 + static_cast<int64_t>(rng() % 300);  // any length, often not divisible
    std::vector<uint32_t> w(L + 1);
    for (auto& x : w) x = 3 + static_cast<uint32_t>(rng() % 30000);
    for (SpLayout layout : {SpLayout::Contiguous, SpLayout::Zigzag}) {
      const int64_t Lp = sp_padded_length(L, layout, W);
      ASSERT_GE(Lp, L);
      ASSERT_EQ(Lp % (layout == SpLayout::Zigzag ? 2 * W : W), 0);
      ASSERT_LT(Lp - L, layout == SpLayout::Zigzag ? 2 * W : W);
      std::vector<int32_t> tok(Lp, -7), lab(Lp, -7);
      int64_t real = 0;
      for (int r = 0; r < W; ++r) {
        SpSlice s = sp_slice(w.data(), L, layout, W, r, /*pad_id=*/0);
        ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), Lp / W);
        real += s.real_labels;
        for (size_t i = 0; i < s.tokens.size(); ++i) {
          int32_t p = s.positions[i];
          ASSERT_GE(p, 0);
          ASSERT_LT(p, Lp);
          ASSERT_EQ(tok[p], -7) << "position " << p << " given to two ranks";
          tok[p] = s.tokens[i];
          lab[p] = s.labels[i];
        }
        if (layout == SpLayout::Zigzag) {  // rank r holds chunks r and 2W-1-r
          int64_t c = Lp / (2 * W);
          EXPECT_EQ(s.positions.front(), r * c);
          EXPECT_EQ(s.positions[c], (2 * W - 1 - r) * c);
        }
      }
      EXPECT_EQ(real, L);
      for (int64_t p = 0; p < Lp; ++p) {
        if (p < L) {
          ASSERT_EQ(tok[p], static_cast<int32_t>(w[p]));
          ASSERT_EQ(lab[p], static_cast<int32_t>(w[p + 1]));
        } else {
          ASSERT_EQ(tok[p], 0);
          ASSERT_EQ(lab[p], -1) << "padding must be ignored by the loss";
        }
      }
    }
  }
}

// usp: the Ulysses parts of ring rank k, concatenated in Ulysses order, are exactly the
// zigzag slice of ring rank k over R = W / U ranks (padded to 2W).
TEST(DataSlice, UspIsZigzagOverRingThenContiguous) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  for (int trial = 0; trial < 30; ++trial) {
    const int U = 1 + static_cast<int>(rng() % 3), R = 1 + static_cast<int>(rng() % 3), W = U * R;
    const int64_t L = 1 + static_cast<int64_t>(rng() % 200);
    std::vector<uint32_t> w(L + 1);
    for (auto& x : w) x = 3 + static_cast<uint32_t>(rng() % 30000);
    const int64_t Lp = sp_padded_length(L, SpLayout::Usp, W, U);
    ASSERT_EQ(Lp % (2 * W), 0);
    int64_t real = 0;
    for (int k = 0; k < R; ++k) {
      // The zigzag slice over R ranks of the sequence padded for usp.
      const int64_t c = Lp / (2 * R);
      std::vector<int32_t> want;
      for (int64_t p = k * c; p < (k + 1) * c; ++p) want.push_back(static_cast<int32_t>(p));
      for (int64_t p = (2 * R - 1 - k) * c; p < (2 * R - k) * c; ++p) want.push_back(static_cast<int32_t>(p));
      std::vector<int32_t> got;
      for (int u = 0; u < U; ++u) {
        SpSlice s = sp_slice(w.data(), L, SpLayout::Usp, W, k * U + u, 0, U);
        ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), Lp / W);
        got.insert(got.end(), s.positions.begin(), s.positions.end());
        real += s.real_labels;
        for (size_t i = 0; i < s.tokens.size(); ++i) {
          if (s.positions[i] < L) {
            ASSERT_EQ(s.tokens[i], static_cast<int32_t>(w[static_cast<size_t>(s.positions[i])]));
          }
        }
      }
      EXPECT_EQ(got, want) << "U=" << U << " R=" << R << " L=" << L;
    }
    EXPECT_EQ(real, L);
  }
}

TEST(DataSlice, PaddingWhenNotDivisibleBy2W) {
  std::vector<uint32_t> w(12);
  std::iota(w.begin(), w.end(), 100);
  // L = 11 over W = 2 zigzag: 4 chunks of 3, padded length 12, one pad.
  SpSlice r0 = sp_slice(w.data(), 11, SpLayout::Zigzag, 2, 0, 9);
  SpSlice r1 = sp_slice(w.data(), 11, SpLayout::Zigzag, 2, 1, 9);
  EXPECT_EQ(r0.positions, (std::vector<int32_t>{0, 1, 2, 9, 10, 11}));
  EXPECT_EQ(r0.tokens, (std::vector<int32_t>{100, 101, 102, 109, 110, 9}));
  EXPECT_EQ(r0.labels, (std::vector<int32_t>{101, 102, 103, 110, 111, -1}));
  EXPECT_EQ(r0.real_labels, 5);
  EXPECT_EQ(r1.positions, (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(r1.real_labels, 6);
  SpSlice none = sp_slice(w.data(), 11, SpLayout::None, 4, 3, 9);
  EXPECT_EQ(none.tokens.size(), 11u);
  EXPECT_EQ(none.real_labels, 11);
  EXPECT_THROW(sp_slice(w.data(), 11, SpLayout::Zigzag, 2, 2, 9), Error);
  EXPECT_EQ(parse_sp_layout("zigzag"), SpLayout::Zigzag);
  EXPECT_THROW(parse_sp_layout("zig-zag"), InputError);
}

TEST(DataLoader, StateSaveRestoreContinuesExactly) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("state");
  easyctx::test::write_random_shard(dir / "s.h5", rng, 200, 300, 32000);
  LoaderOptions o;
  o.path = dir / "s.h5";
  o.seq_length = 8 + rng() % 64;
  o.seed = rng();
  o.shape = {2, 3, 1};
  o.sp_layout = SpLayout::Zigzag;
  o.sp_size = 2;
  o.sp_rank = 1;
  DataLoader a(o);
  const int before = 1 + rng() % 10;
  for (int i = 0; i < before; ++i) a.next();
  std::string saved = a.state().to_json();
  std::vector<MicroBatch> expect;
  for (int i = 0; i < 7; ++i) expect.push_back(a.next());

  DataLoader b(o);
  b.restore(LoaderState::from_json(saved));
  EXPECT_EQ(b.state().to_json(), saved);
  for (int i = 0; i < 7; ++i) {
    MicroBatch mb = b.next();
    EXPECT_EQ(mb.step, expect[i].step);
    EXPECT_EQ(mb.micro, expect[i].micro);
    EXPECT_EQ(mb.sample_ids, expect[i].sample_ids);
    EXPECT_EQ(mb.tokens, expect[i].tokens);
    EXPECT_EQ(mb.labels, expect[i].labels);
    EXPECT_EQ(mb.positions, expect[i].positions);
  }
  // Another seed or sequence length cannot resume this cursor.
  LoaderOptions o2 = o;
  o2.seed = o.seed + 1;
  DataLoader c(o2);
  EXPECT_THROW(c.restore(LoaderState::from_json(saved)), InputError);
  EXPECT_THROW(LoaderState::from_json("{\"seed\": 1}"), Error);
}
