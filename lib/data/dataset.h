// TokenDataset: the concatenation of the token streams of a set of shards, in file-name
// order, as one 64-bit addressed stream. Documents stay intact inside their shard; the
// stream view is what the sampler cuts windows from (windows may cross document and shard
// boundaries, as in EasyContext's packed rows).
//
// Not thread-safe: one thread reads (it keeps a small cache of open HDF5 files).
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "data/shard.h"

namespace easyctx::data {

class TokenDataset {
 public:
  // spec: a shard file, a folder (every "*.h5" directly inside it, ".tmp" files ignored),
  // or a glob pattern ("data/shard-*.h5"). Files are sorted by name. Throws InputError when
  // nothing matches, a file is not a shard, or shards disagree on tokenizer hash, vocab
  // size or BOS/EOS ids (naming both files).
  explicit TokenDataset(const std::string& spec, size_t max_open_files = 16);
  static std::vector<std::string> resolve(const std::string& spec);

  const std::string& spec() const { return spec_; }
  size_t num_files() const { return files_.size(); }
  const std::string& file(size_t i) const { return files_.at(i); }
  uint64_t file_tokens(size_t i) const { return starts_.at(i + 1) - starts_.at(i); }
  uint64_t num_tokens() const { return starts_.back(); }
  uint64_t num_docs() const { return num_docs_; }
  const ShardMeta& meta() const { return meta_; }  // of the first file (all agree)

  // Checks the shards against the model: meta vocab_size <= model_vocab, and (when
  // expected_sha256 is not empty) the tokenizer hash. full_scan also reads every token and
  // checks id < model_vocab (otherwise ids are checked per window by check_ids).
  // Throws InputError naming the file and what was expected.
  void validate(int64_t model_vocab, const std::string& expected_sha256 = "", bool full_scan = false) const;

  // Copies stream tokens [offset, offset + count) into out (may span files).
  void read(uint64_t offset, uint64_t count, uint32_t* out) const;
  // Loss weights of stream tokens [offset, offset + count): 1 where a shard has none.
  void read_weights(uint64_t offset, uint64_t count, uint8_t* out) const;
  // Whether any shard stores loss weights (format_version 2).
  bool has_loss_weights() const { return has_weights_; }
  // Every loss weight of the stream in order, a block at a time: fn(stream offset, weights, n)
  // (file by file; 1 where a shard has none). Reads 1 byte per token.
  void scan_weights(const std::function<void(uint64_t, const uint8_t*, uint64_t)>& fn) const;
  // Stream offsets of every document start, then num_tokens(): document d is stream tokens
  // [doc_starts()[d], doc_starts()[d+1]). Read from the shards on first use (8 bytes per
  // document), so runs that never ask pay nothing.
  const std::vector<uint64_t>& doc_starts() const;
  // File and shard-local document index of stream document d (for error messages).
  std::string describe_doc(uint64_t d) const;
  // Throws InputError naming the file and the stream offset of the first id >= vocab in
  // ids[0..count), which were read from stream offset `offset`.
  void check_ids(const uint32_t* ids, uint64_t count, uint64_t offset, int64_t vocab) const;
  // File index holding stream offset `offset`.
  size_t file_of(uint64_t offset) const;

 private:
  const TokenShardReader& reader(size_t i) const;
  template <class T, class ReadPart>
  void read_span(uint64_t offset, uint64_t count, T* out, const char* what, ReadPart&& read_part) const;
  std::string spec_;
  std::vector<std::string> files_;
  std::vector<uint64_t> starts_;  // starts_[i] = stream offset of file i; back() = total
  uint64_t num_docs_ = 0;
  bool has_weights_ = false;
  mutable std::vector<uint64_t> doc_starts_;      // lazily filled
  mutable std::vector<uint64_t> file_first_doc_;  // [files + 1], with doc_starts_
  ShardMeta meta_;
  size_t max_open_;
  mutable std::list<std::pair<size_t, std::unique_ptr<TokenShardReader>>> open_;  // LRU, front = newest
};

}  // namespace easyctx::data
