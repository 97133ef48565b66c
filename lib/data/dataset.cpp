#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/checked.h"
#include "core/error.h"
#include "core/strings.h"

namespace easyctx::data {
namespace fs = std::filesystem;

std::vector<std::string> TokenDataset::resolve(const std::string& spec) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    for (const auto& e : fs::directory_iterator(spec, ec)) {
      std::string p = e.path().string();
      if (e.is_regular_file() && ends_with(p, ".h5")) files.push_back(p);
    }
    EASYCTX_CHECK_INPUT(!ec, "cannot list data folder ", spec, ": ", ec.message());
  } else if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    int rc = ::glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    EASYCTX_CHECK_INPUT(rc == 0 || rc == GLOB_NOMATCH, "glob ", spec, " failed (read error)");
  } else {
    EASYCTX_CHECK_INPUT(fs::exists(spec, ec), "data path ", spec,
                        " does not exist (expected a shard file, folder or glob)");
    files.push_back(spec);
  }
  std::sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).filename().string() < fs::path(b).filename().string() ||
           (fs::path(a).filename() == fs::path(b).filename() && a < b);
  });
  EASYCTX_CHECK_INPUT(!files.empty(), "no token shards (*.h5) found at ", spec);
  return files;
}

TokenDataset::TokenDataset(const std::string& spec, size_t max_open_files)
    : spec_(spec), files_(resolve(spec)), max_open_(std::max<size_t>(1, max_open_files)) {
  starts_.push_back(0);
  for (size_t i = 0; i < files_.size(); ++i) {
    TokenShardReader r(files_[i]);
    const ShardMeta& m = r.meta();
    if (i == 0) {
      meta_ = m;
    } else {
      EASYCTX_CHECK_INPUT(m.tokenizer_sha256 == meta_.tokenizer_sha256, files_[i], ": tokenizer_sha256 ",
                          m.tokenizer_sha256, " differs from ", files_[0], " (", meta_.tokenizer_sha256,
                          "); shards of one dataset must share a tokenizer");
      EASYCTX_CHECK_INPUT(m.vocab_size == meta_.vocab_size, files_[i], ": vocab_size ", m.vocab_size, " differs from ",
                          files_[0], " (", meta_.vocab_size, ")");
      EASYCTX_CHECK_INPUT(m.bos_id == meta_.bos_id && m.eos_id == meta_.eos_id, files_[i], ": BOS/EOS ids differ from ",
                          files_[0]);
    }
    has_weights_ = has_weights_ || m.has_loss_weights;
    starts_.push_back(checked_add(starts_.back(), r.num_tokens(), "tokens of the dataset " + spec_));
    num_docs_ = checked_add(num_docs_, r.num_docs(), "documents of the dataset " + spec_);
  }
}

size_t TokenDataset::file_of(uint64_t offset) const {
  EASYCTX_CHECK(offset < num_tokens(), "stream offset ", offset, " >= dataset size ", num_tokens());
  // The last start <= offset whose file is not empty.
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

const TokenShardReader& TokenDataset::reader(size_t i) const {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first == i) {
      open_.splice(open_.begin(), open_, it);
      return *open_.front().second;
    }
  }
  if (open_.size() >= max_open_) open_.pop_back();
  open_.emplace_front(i, std::make_unique<TokenShardReader>(files_[i]));
  EASYCTX_CHECK_INPUT(open_.front().second->num_tokens() == file_tokens(i), files_[i],
                      " changed size while the dataset was open");
  return *open_.front().second;
}

// [offset, offset + count) of the concatenated files, a file's part at a time through
// read_part(reader, local offset, count, out).
template <class T, class ReadPart>
void TokenDataset::read_span(uint64_t offset, uint64_t count, T* out, const char* what, ReadPart&& read_part) const {
  EASYCTX_CHECK(offset <= num_tokens() && count <= num_tokens() - offset, "dataset ", what, " [", offset, ", ",
                offset + count, ") outside [0, ", num_tokens(), ") of ", spec_);
  while (count > 0) {
    size_t f = file_of(offset);
    uint64_t local = offset - starts_[f];
    uint64_t take = std::min(count, file_tokens(f) - local);
    read_part(reader(f), local, take, out);
    out += take;
    offset += take;
    count -= take;
  }
}

void TokenDataset::read(uint64_t offset, uint64_t count, uint32_t* out) const {
  read_span(offset, count, out, "read",
            [](const TokenShardReader& r, uint64_t at, uint64_t n, uint32_t* o) { r.read(at, n, o); });
}

void TokenDataset::read_weights(uint64_t offset, uint64_t count, uint8_t* out) const {
  read_span(offset, count, out, "weight read",
            [](const TokenShardReader& r, uint64_t at, uint64_t n, uint8_t* o) { r.read_weights(at, n, o); });
}

void TokenDataset::scan_weights(const std::function<void(uint64_t, const uint8_t*, uint64_t)>& fn) const {
  std::vector<uint8_t> buf;
  const uint64_t block = uint64_t{1} << 20;
  for (size_t f = 0; f < files_.size(); ++f)
    for (uint64_t at = 0; at < file_tokens(f); at += block) {
      buf.resize(std::min(block, file_tokens(f) - at));
      reader(f).read_weights(at, buf.size(), buf.data());
      fn(starts_[f] + at, buf.data(), buf.size());
    }
}

const std::vector<uint64_t>& TokenDataset::doc_starts() const {
  if (!doc_starts_.empty()) return doc_starts_;
  std::vector<uint64_t> v, first;
  v.reserve(num_docs_ + 1);
  for (size_t i = 0; i < files_.size(); ++i) {
    first.push_back(v.size());
    const std::vector<uint64_t>& off = reader(i).doc_offsets();
    for (size_t d = 0; d + 1 < off.size(); ++d) v.push_back(starts_[i] + off[d]);
  }
  first.push_back(v.size());
  v.push_back(num_tokens());
  doc_starts_ = std::move(v);
  file_first_doc_ = std::move(first);
  return doc_starts_;
}

std::string TokenDataset::describe_doc(uint64_t d) const {
  doc_starts();
  auto it = std::upper_bound(file_first_doc_.begin(), file_first_doc_.end(), d);
  size_t f = static_cast<size_t>(it - file_first_doc_.begin()) - 1;
  f = std::min(f, files_.size() - 1);
  return files_[f] + " document " + std::to_string(d - file_first_doc_[f]);
}

void TokenDataset::check_ids(const uint32_t* ids, uint64_t count, uint64_t offset, int64_t vocab) const {
  for (uint64_t i = 0; i < count; ++i) {
    if (static_cast<int64_t>(ids[i]) >= vocab) {
      size_t f = file_of(offset + i);
      EASYCTX_THROW_INPUT(files_[f], ": token ", offset + i - starts_[f], " has id ", ids[i],
                          ", expected < vocab size ", vocab, " of the model (wrong tokenizer for this model?)");
    }
  }
}

void TokenDataset::validate(int64_t model_vocab, const std::string& expected_sha256, bool full_scan) const {
  EASYCTX_CHECK(model_vocab > 0, "validate: model vocab must be > 0");
  EASYCTX_CHECK_INPUT(meta_.vocab_size <= model_vocab, files_[0], ": shards were tokenized with vocab_size ",
                      meta_.vocab_size, " but the model has vocab ", model_vocab,
                      " (expected shard vocab <= model vocab)");
  if (!expected_sha256.empty())
    EASYCTX_CHECK_INPUT(meta_.tokenizer_sha256 == expected_sha256, files_[0], ": tokenizer_sha256 ",
                        meta_.tokenizer_sha256, ", expected ", expected_sha256, " (data.tokenizer_sha256)");
  if (!full_scan) return;
  std::vector<uint32_t> buf(1 << 20);
  for (uint64_t off = 0; off < num_tokens(); off += buf.size()) {
    uint64_t n = std::min<uint64_t>(buf.size(), num_tokens() - off);
    read(off, n, buf.data());
    check_ids(buf.data(), n, off, model_vocab);
  }
}

}  // namespace easyctx::data
