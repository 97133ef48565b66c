// Helpers for trainer/eval tests: scratch folders and a learnable token shard.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/shard.h"
#include "dist/groups.h"
#include "test_util.h"

namespace easyctx::test {

// This rank alone, as an MPI communicator named `name` (a one-rank trainer's world and dp).
inline std::unique_ptr<dist::Comm> self_comm(const char* name) {
  return dist::make_comm(MPI_COMM_SELF, name, dist::CommBackend::Mpi, 60);
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const char* t = std::getenv("TMPDIR");
    path_ = std::string(t ? t : "/tmp") + "/easyctx-" + tag + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(test_seed() % 1000000);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& n) const { return path_ + "/" + n; }

 private:
  std::string path_;
};

// Documents of a noisy affine walk: BOS, then next = (7 * prev + 3 + noise) mod vocab with
// noise in {0, 1, 2}: a bigram model reaches ~log(3) nats, far below log(vocab).
// Returns the documents as written.
inline std::vector<std::vector<uint32_t>> write_walk_shard(const std::string& path, uint64_t seed, int docs,
                                                           int min_len, int max_len, int64_t vocab) {
  data::ShardMeta meta;
  meta.tokenizer_name = "synthetic";
  meta.tokenizer_sha256 = std::string(64, '0');
  meta.vocab_size = vocab;
  meta.bos_id = 1;
  meta.eos_id = 2;
  data::TokenShardWriter w(path, meta, 4096);
  const uint16_t src = w.source_index("walk");
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> out;
  for (int d = 0; d < docs; ++d) {
    const int len = std::uniform_int_distribution<int>(min_len, max_len)(rng);
    std::vector<uint32_t> ids{1};
    uint32_t x = static_cast<uint32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3));
    while (static_cast<int>(ids.size()) < len) {
      ids.push_back(x);
      x = static_cast<uint32_t>((7 * x + 3 + rng() % 3) % static_cast<uint64_t>(vocab));
    }
    w.add_document(ids.data(), ids.size(), src);
    out.push_back(ids);
  }
  w.commit();
  return out;
}

// The tiny preset (configs/models/tiny.yaml) with `layers` layers, as dir/tiny<layers>.yaml.
inline std::string write_tiny_model(const std::string& dir, int layers) {
  const std::string path = dir + "/tiny" + std::to_string(layers) + ".yaml";
  std::ofstream(path) << "hidden_size: 64\nnum_hidden_layers: " << layers
                      << "\nnum_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 16\n"
                         "intermediate_size: 172\nvocab_size: 256\nmax_position_embeddings: 2048\n"
                         "rms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\n"
                         "bos_token_id: 1\neos_token_id: 2\n";
  return path;
}

inline StageConfig tiny_stage(const std::string& data, const std::string& out) {
  StageConfig c;
  c.model.config = "tiny";
  c.data.path = data;
  c.data.seq_length = 32;
  c.train.steps = 4;
  c.train.lr = 3e-3;
  c.train.batch_size = 2;
  c.train.grad_accum = 1;
  c.train.warmup_steps = 0;
  c.train.device = DeviceKind::Cpu;
  c.train.deterministic = true;  // the GPU tests compare runs and resumes bit for bit
  c.activation.checkpoint = CheckpointPolicy::Layer;
  c.output.dir = out;
  c.logging.metrics = false;
  return c;
}

// The documents of a walk shard (write_walk_shard's arguments).
struct WalkShape {
  int docs = 120, min_len = 10, max_len = 90, vocab = 256;
};

// A folder shared by every rank of MPI_COMM_WORLD (fresh; seed drawn on rank 0 and
// broadcast), with rank 0's `write(dir)` done before anyone returns.
inline std::string shared_dir(const std::string& tag, uint64_t& seed,
                              const std::function<void(const std::string&)>& write) {
  seed = test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/easyctx-" + tag + "-" + std::to_string(seed % 1000003);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    if (write) write(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// Under mpirun: a fresh /tmp/easyctx-<tag>-<seed> folder shared by every rank (shared_dir), holding a
// walk shard written by rank 0 (by default 120 documents of 10..90 tokens, vocab 256) and
// whatever `rank0_also` writes there.
inline std::string shared_walk_dir(const std::string& tag, uint64_t& seed, const WalkShape& shape = {},
                                   const std::function<void(const std::string&)>& rank0_also = nullptr) {
  return shared_dir(tag, seed, [&](const std::string& path) {
    write_walk_shard(path + "/shard.h5", seed, shape.docs, shape.min_len, shape.max_len, shape.vocab);
    if (rank0_also) rank0_also(path);
  });
}

}  // namespace easyctx::test
