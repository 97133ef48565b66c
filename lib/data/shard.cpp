#include "data/shard.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/h5util.h"

namespace easyctx::data {
namespace fs = std::filesystem;
using h5::Handle;

namespace {
const char* kStdAttrs[] = {"format", "format_version", "tokenizer_sha256", "tokenizer_name", "vocab_size",
                           "bos_id", "eos_id",         "add_bos",          "add_eos",        "easyctx_version"};

void write_meta(const Handle& f, const ShardMeta& m, const std::string& path) {
  h5::write_attr_string(f, "format", kShardFormat, path);
  h5::write_attr_int(f, "format_version", m.has_loss_weights ? kShardFormatVersionWeights : kShardFormatVersion, path);
  h5::write_attr_string(f, "tokenizer_sha256", m.tokenizer_sha256, path);
  h5::write_attr_string(f, "tokenizer_name", m.tokenizer_name, path);
  h5::write_attr_int(f, "vocab_size", m.vocab_size, path);
  h5::write_attr_int(f, "bos_id", m.bos_id, path);
  h5::write_attr_int(f, "eos_id", m.eos_id, path);
  h5::write_attr_int(f, "add_bos", m.add_bos ? 1 : 0, path);
  h5::write_attr_int(f, "add_eos", m.add_eos ? 1 : 0, path);
  h5::write_attr_string(f, "easyctx_version", EASYCTX_VERSION, path);
  for (const auto& [k, v] : m.extra) {
    for (const char* s : kStdAttrs) EASYCTX_CHECK(k != s, "extra shard attribute ", k, " clashes with a standard one");
    h5::write_attr_string(f, k.c_str(), v, path);
  }
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* op) {
  static_cast<std::vector<std::string>*>(op)->push_back(name);
  return 0;
}

ShardMeta load_meta(const Handle& f, const std::string& path) {
  EASYCTX_CHECK_INPUT(h5::has_attr(f, "format", path) && h5::read_attr_string(f, "format", path) == kShardFormat, path,
                      ": not an easyctx token shard (root attribute format != \"", kShardFormat, "\")");
  int64_t ver = h5::read_attr_int(f, "format_version", path);
  EASYCTX_CHECK_INPUT(ver == kShardFormatVersion || ver == kShardFormatVersionWeights, path, ": shard format_version ",
                      ver, ", this build reads ", kShardFormatVersion, " and ", kShardFormatVersionWeights);
  ShardMeta m;
  m.has_loss_weights = ver == kShardFormatVersionWeights;
  m.tokenizer_sha256 = h5::read_attr_string(f, "tokenizer_sha256", path);
  m.tokenizer_name = h5::read_attr_string(f, "tokenizer_name", path);
  m.vocab_size = h5::read_attr_int(f, "vocab_size", path);
  m.bos_id = h5::read_attr_int(f, "bos_id", path);
  m.eos_id = h5::read_attr_int(f, "eos_id", path);
  m.add_bos = h5::read_attr_int(f, "add_bos", path) != 0;
  m.add_eos = h5::read_attr_int(f, "add_eos", path) != 0;
  m.easyctx_version = h5::read_attr_string(f, "easyctx_version", path);
  std::vector<std::string> names;
  hsize_t idx = 0;
  h5::check(H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr_name, &names), "H5Aiterate2", path);
  for (const auto& n : names) {
    bool std_attr = false;
    for (const char* s : kStdAttrs) std_attr |= (n == s);
    if (!std_attr) m.extra[n] = h5::read_attr_string(f, n.c_str(), path);
  }
  EASYCTX_CHECK_INPUT(m.vocab_size > 0, path, ": vocab_size attribute is ", m.vocab_size, ", expected > 0");
  return m;
}
}  // namespace

// ---- writer ---------------------------------------------------------------------------
struct TokenShardWriter::Impl {
  Handle file, tokens, weights;
};

TokenShardWriter::TokenShardWriter(std::string final_path, ShardMeta meta, uint64_t chunk_tokens, int deflate_level)
    : final_path_(std::move(final_path)),
      tmp_path_(final_path_ + ".tmp"),
      meta_(std::move(meta)),
      impl_(std::make_unique<Impl>()),
      chunk_(std::max<uint64_t>(1, chunk_tokens)) {
  EASYCTX_CHECK(meta_.vocab_size > 0, "TokenShardWriter: vocab_size must be > 0 for ", final_path_);
  std::error_code ec;
  fs::remove(tmp_path_, ec);
  impl_->file = h5::create_file(tmp_path_);
  impl_->tokens = h5::create_extendible(impl_->file, "tokens", H5T_STD_U32LE, chunk_, deflate_level, tmp_path_);
  if (meta_.has_loss_weights) {
    impl_->weights = h5::create_extendible(impl_->file, "loss_weights", H5T_STD_U8LE, chunk_, deflate_level, tmp_path_);
    pending_w_.reserve(chunk_);
  }
  pending_.reserve(chunk_);
}

TokenShardWriter::~TokenShardWriter() {
  if (committed_) return;
  impl_.reset();  // close handles before unlinking
  std::error_code ec;
  fs::remove(tmp_path_, ec);
}

uint16_t TokenShardWriter::source_index(const std::string& name) {
  for (size_t i = 0; i < sources_.size(); ++i)
    if (sources_[i] == name) return static_cast<uint16_t>(i);
  EASYCTX_CHECK(sources_.size() < 65535, final_path_, ": more than 65535 distinct sources");
  sources_.push_back(name);
  return static_cast<uint16_t>(sources_.size() - 1);
}

void TokenShardWriter::add_document(const uint32_t* ids, uint64_t n, uint16_t source, const uint8_t* weights) {
  EASYCTX_CHECK(!committed_, "add_document after commit on ", final_path_);
  const bool w = meta_.has_loss_weights;
  EASYCTX_CHECK(!w || weights || n == 0, "add_document: ", final_path_, " stores loss weights but none were given");
  if (w)
    for (uint64_t i = 0; i < n; ++i)
      EASYCTX_CHECK(weights[i] <= 1, "loss weight ", int(weights[i]), " is not 0 or 1 while writing ", final_path_);
  EASYCTX_CHECK(source < sources_.size(), "add_document: source index ", source, " not registered");
  const uint64_t vocab = static_cast<uint64_t>(meta_.vocab_size);
  for (uint64_t i = 0; i < n; ++i)
    EASYCTX_CHECK(ids[i] < vocab, "token id ", ids[i], " >= vocab_size ", vocab, " while writing ", final_path_);
  for (uint64_t i = 0; i < n;) {
    uint64_t take = std::min<uint64_t>(n - i, chunk_ - pending_.size());
    pending_.insert(pending_.end(), ids + i, ids + i + take);
    if (w) pending_w_.insert(pending_w_.end(), weights + i, weights + i + take);
    i += take;
    if (pending_.size() == chunk_) flush_tokens();
  }
  total_tokens_ += n;
  offsets_.push_back(total_tokens_);
  doc_source_.push_back(source);
}

void TokenShardWriter::flush_tokens() {
  h5::append_1d(impl_->tokens, H5T_NATIVE_UINT32, written_, pending_.size(), pending_.data(), "tokens", tmp_path_);
  if (meta_.has_loss_weights) {
    h5::append_1d(impl_->weights, H5T_NATIVE_UINT8, written_, pending_w_.size(), pending_w_.data(), "loss_weights",
                  tmp_path_);
    pending_w_.clear();
  }
  written_ += pending_.size();
  pending_.clear();
}

void TokenShardWriter::commit() {
  EASYCTX_CHECK(!committed_, "commit called twice on ", final_path_);
  flush_tokens();
  const std::string& p = tmp_path_;
  uint64_t dchunk = std::max<uint64_t>(1, std::min<uint64_t>(offsets_.size(), 1 << 16));
  Handle off = h5::create_extendible(impl_->file, "doc_offsets", H5T_STD_U64LE, dchunk, 0, p);
  h5::append_1d(off, H5T_NATIVE_UINT64, 0, offsets_.size(), offsets_.data(), "doc_offsets", p);
  Handle src = h5::create_extendible(impl_->file, "doc_source", H5T_STD_U16LE, dchunk, 0, p);
  h5::append_1d(src, H5T_NATIVE_UINT16, 0, doc_source_.size(), doc_source_.data(), "doc_source", p);
  h5::write_strings(impl_->file, "sources", sources_, p);
  write_meta(impl_->file, meta_, p);
  off.reset();
  src.reset();
  h5::check(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "H5Fflush", p);
  impl_->tokens.reset();
  impl_->weights.reset();
  impl_->file.reset();
  std::error_code ec;
  fs::rename(tmp_path_, final_path_, ec);
  EASYCTX_CHECK(!ec, "cannot rename ", tmp_path_, " to ", final_path_, ": ", ec.message());
  committed_ = true;
}

// ---- reader ---------------------------------------------------------------------------
struct TokenShardReader::Impl {
  Handle file, tokens, weights;
};

TokenShardReader::TokenShardReader(const std::string& path) : path_(path), impl_(std::make_unique<Impl>()) {
  impl_->file = h5::open_file(path, false);
  meta_ = load_meta(impl_->file, path);
  impl_->tokens = h5::open_dataset(impl_->file, "tokens", path);
  h5::expect_unsigned(impl_->tokens, "tokens", sizeof(uint32_t), path);
  num_tokens_ = h5::dataset_length(impl_->tokens, "tokens", path);
  if (meta_.has_loss_weights) {
    impl_->weights = h5::open_dataset(impl_->file, "loss_weights", path);
    h5::expect_unsigned(impl_->weights, "loss_weights", sizeof(uint8_t), path);
    uint64_t nw = h5::dataset_length(impl_->weights, "loss_weights", path);
    EASYCTX_CHECK_INPUT(nw == num_tokens_, path, ": /loss_weights has ", nw, " entries but /tokens has ", num_tokens_);
  } else {
    EASYCTX_CHECK_INPUT(!h5::check(H5Lexists(impl_->file, "loss_weights", H5P_DEFAULT), "H5Lexists", path), path,
                        ": format_version 1 with a /loss_weights dataset: version 1 has no loss weights, so they would "
                        "be ignored and every token trained; set the root attribute format_version to 2 if the "
                        "weights are meant, else delete /loss_weights (docs/data.md, \"Token shards\")");
  }
  Handle off = h5::open_dataset(impl_->file, "doc_offsets", path);
  h5::expect_unsigned(off, "doc_offsets", sizeof(uint64_t), path);
  uint64_t n_off = h5::dataset_length(off, "doc_offsets", path);
  EASYCTX_CHECK_INPUT(n_off >= 1, path, ": /doc_offsets is empty, expected D+1 >= 1 entries");
  offsets_.resize(n_off);
  h5::read_1d(off, H5T_NATIVE_UINT64, 0, n_off, offsets_.data(), "doc_offsets", path);
  EASYCTX_CHECK_INPUT(offsets_[0] == 0, path, ": /doc_offsets[0] = ", offsets_[0], ", expected 0");
  for (uint64_t i = 1; i < n_off; ++i)
    EASYCTX_CHECK_INPUT(offsets_[i] >= offsets_[i - 1], path, ": /doc_offsets decreases at index ", i);
  EASYCTX_CHECK_INPUT(offsets_.back() == num_tokens_, path, ": /doc_offsets ends at ", offsets_.back(),
                      " but /tokens has ", num_tokens_, " tokens");
  Handle src = h5::open_dataset(impl_->file, "doc_source", path);
  h5::expect_unsigned(src, "doc_source", sizeof(uint16_t), path);
  uint64_t n_src = h5::dataset_length(src, "doc_source", path);
  EASYCTX_CHECK_INPUT(n_src == n_off - 1, path, ": /doc_source has ", n_src, " entries, expected ", n_off - 1);
  doc_source_.resize(n_src);
  h5::read_1d(src, H5T_NATIVE_UINT16, 0, n_src, doc_source_.data(), "doc_source", path);
  sources_ = h5::read_strings(impl_->file, "sources", path);
  for (uint64_t i = 0; i < n_src; ++i)
    EASYCTX_CHECK_INPUT(doc_source_[i] < sources_.size(), path, ": /doc_source[", i, "] = ", doc_source_[i],
                        " but /sources has ", sources_.size(), " names");
}

TokenShardReader::~TokenShardReader() = default;
TokenShardReader::TokenShardReader(TokenShardReader&&) noexcept = default;
TokenShardReader& TokenShardReader::operator=(TokenShardReader&&) noexcept = default;

void TokenShardReader::read(uint64_t offset, uint64_t count, uint32_t* out) const {
  EASYCTX_CHECK(offset <= num_tokens_ && count <= num_tokens_ - offset, path_, ": read of tokens [", offset, ", ",
                offset + count, ") is outside [0, ", num_tokens_, ")");
  h5::read_1d(impl_->tokens, H5T_NATIVE_UINT32, offset, count, out, "tokens", path_);
}

void TokenShardReader::read_weights(uint64_t offset, uint64_t count, uint8_t* out) const {
  EASYCTX_CHECK(offset <= num_tokens_ && count <= num_tokens_ - offset, path_, ": read of loss weights [", offset, ", ",
                offset + count, ") is outside [0, ", num_tokens_, ")");
  if (!meta_.has_loss_weights) {
    std::fill(out, out + count, uint8_t{1});
    return;
  }
  h5::read_1d(impl_->weights, H5T_NATIVE_UINT8, offset, count, out, "loss_weights", path_);
  // Another value would scale that token's loss silently (and counted as several targets).
  const uint8_t* bad = std::find_if(out, out + count, [](uint8_t w) { return w > 1; });
  if (bad != out + count)
    EASYCTX_THROW_INPUT(path_, ": /loss_weights[", offset + static_cast<uint64_t>(bad - out), "] is ", int{*bad},
                        ", expected 0 or 1 (1: a training target, 0: context only; docs/data.md, \"Token shards\")");
}

std::vector<uint32_t> TokenShardReader::read(uint64_t offset, uint64_t count) const {
  std::vector<uint32_t> v(count);
  read(offset, count, v.data());
  return v;
}

ShardMeta read_shard_meta(const std::string& path) {
  Handle f = h5::open_file(path, false);
  return load_meta(f, path);
}

}  // namespace easyctx::data
