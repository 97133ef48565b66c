// Token shards: the HDF5 files h5tokenize writes and the loader reads.
//
// Layout of one shard (docs/data.md has the full description):
//   /tokens       uint32 [T]    token ids of every document, concatenated, chunked
//   /doc_offsets  uint64 [D+1]  document d is tokens[doc_offsets[d] .. doc_offsets[d+1]);
//                               doc_offsets[0] = 0, doc_offsets[D] = T, non-decreasing
//   /doc_source   uint16 [D]    index into /sources
//   /sources      vlen UTF-8 string [S]  source names ("RedPajamaBook", ...)
//   /loss_weights uint8 [T]     optional (format_version 2 only): 1 = the token is a training
//                               target, 0 = context only (chat prompts, template tokens). 0/1
//                               is all SFT needs, and a byte per token keeps the file small.
//   root attributes: format = "easyctx-token-shard", format_version, tokenizer_sha256,
//   tokenizer_name, vocab_size, bos_id, eos_id (-1 = none), add_bos, add_eos,
//   easyctx_version, plus free-form string attributes from the producer (h5tokenize
//   stores its resume cursor in "h5tokenize").
// A shard is written under "<name>.tmp" and renamed to its final name by commit(), so a file
// with the final name is always complete.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace easyctx::data {

inline constexpr const char* kShardFormat = "easyctx-token-shard";
// format_version 1: tokens and document index only. 2: also /loss_weights. A writer writes 1
// unless it stores loss weights, so plain shards stay readable by older builds, and an older
// build refuses a shard whose weights it would silently ignore.
inline constexpr int64_t kShardFormatVersion = 1;
inline constexpr int64_t kShardFormatVersionWeights = 2;

struct ShardMeta {
  std::string tokenizer_sha256;  // 64 hex chars of the tokenizer file
  std::string tokenizer_name;    // file name, informative only
  int64_t vocab_size = 0;        // every id is < vocab_size
  int64_t bos_id = -1;           // -1: the tokenizer has none
  int64_t eos_id = -1;
  bool add_bos = true;                       // BOS was prepended to every document
  bool add_eos = false;                      // EOS was appended to every document
  bool has_loss_weights = false;             // /loss_weights present (format_version 2)
  std::string easyctx_version;               // filled by the writer (EASYCTX_VERSION)
  std::map<std::string, std::string> extra;  // producer attributes (string-valued)
};

class TokenShardWriter {
 public:
  // Creates `final_path + ".tmp"` (replacing a stale one). chunk_tokens: HDF5 chunk of
  // /tokens; deflate_level 0 = uncompressed (fastest random access).
  TokenShardWriter(std::string final_path, ShardMeta meta, uint64_t chunk_tokens = 1 << 20, int deflate_level = 0);
  ~TokenShardWriter();  // without commit(): closes and deletes the temporary file
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Index of a source name in /sources (added on first use; at most 65535 sources).
  uint16_t source_index(const std::string& name);
  // Appends one document. Ids must be < meta.vocab_size (checked). weights: n bytes of 0/1,
  // required when meta.has_loss_weights, ignored otherwise.
  void add_document(const uint32_t* ids, uint64_t n, uint16_t source, const uint8_t* weights = nullptr);
  void set_extra(const std::string& key, const std::string& value) { meta_.extra[key] = value; }

  uint64_t num_tokens() const { return total_tokens_; }
  uint64_t num_docs() const { return offsets_.size() - 1; }
  const std::string& final_path() const { return final_path_; }

  // Writes the index datasets and attributes, flushes, closes and renames to final_path.
  // A failed write (here or in add_document) throws h5::IoError naming the file and the
  // cause (ENOSPC, EFBIG, ...) where the system gave one; the writer is then unusable and
  // its destructor removes the temporary file without closing it through HDF5.
  void commit();

 private:
  struct Impl;
  void flush_tokens();
  void write_and_close();
  template <typename F>
  void guarded(F&& f);  // runs f; an exception marks the file failed
  std::string final_path_, tmp_path_;
  ShardMeta meta_;
  std::unique_ptr<Impl> impl_;
  std::vector<uint32_t> pending_;
  std::vector<uint8_t> pending_w_;
  uint64_t chunk_ = 0, written_ = 0, total_tokens_ = 0;
  std::vector<uint64_t> offsets_{0};
  std::vector<uint16_t> doc_source_;
  std::vector<std::string> sources_;
  bool committed_ = false;
  bool failed_ = false;  // a write failed: the file is abandoned, never closed (~TokenShardWriter)
};

class TokenShardReader {
 public:
  // Opens the shard read-only and checks its structure: format attribute, 1-D datasets,
  // element types (/tokens uint32, /doc_offsets uint64, /doc_source uint16: never converted),
  // doc_offsets[0] = 0, non-decreasing, last = number of tokens, doc_source < #sources.
  // Throws InputError naming the file and the failed expectation.
  explicit TokenShardReader(const std::string& path);
  ~TokenShardReader();
  TokenShardReader(TokenShardReader&&) noexcept;
  TokenShardReader& operator=(TokenShardReader&&) noexcept;

  const std::string& path() const { return path_; }
  const ShardMeta& meta() const { return meta_; }
  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t num_docs() const { return offsets_.size() - 1; }
  const std::vector<uint64_t>& doc_offsets() const { return offsets_; }
  const std::vector<uint16_t>& doc_source() const { return doc_source_; }
  const std::vector<std::string>& sources() const { return sources_; }

  // Copies tokens[offset, offset + count) into out; throws when out of range.
  void read(uint64_t offset, uint64_t count, uint32_t* out) const;
  std::vector<uint32_t> read(uint64_t offset, uint64_t count) const;
  // Copies loss_weights[offset, offset + count) into out; all 1 for a shard without them
  // (every token is a target, as before weights existed).
  void read_weights(uint64_t offset, uint64_t count, uint8_t* out) const;

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
  ShardMeta meta_;
  uint64_t num_tokens_ = 0;
  std::vector<uint64_t> offsets_;
  std::vector<uint16_t> doc_source_;
  std::vector<std::string> sources_;
};

// Reads only the root attributes of a shard (cheap; used to check finished shards).
ShardMeta read_shard_meta(const std::string& path);

}  // namespace easyctx::data
