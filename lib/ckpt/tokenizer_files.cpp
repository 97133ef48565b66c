#include "ckpt/tokenizer_files.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/sha256.h"
#include "data/shard.h"

namespace easyctx::ckpt {
namespace fs = std::filesystem;

int copy_tokenizer_files(const std::string& from, const std::string& dir) {
  int n = 0;
  for (const char* name : kTokenizerFiles) {
    const fs::path src = fs::path(from) / name;
    if (!fs::is_regular_file(src)) continue;
    std::error_code ec;
    fs::copy_file(src, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
    EASYCTX_CHECK(!ec, "cannot copy ", src.string(), " to ", dir, ": ", ec.message());
    ++n;
  }
  return n;
}

std::string export_tokenizer_files(const std::string& data_path, const std::string& dir) {
  std::vector<std::string> shards;
  try {
    shards = data::TokenDataset::resolve(data_path);
  } catch (const std::exception& e) {
    log_warn("no tokenizer files in ", dir, ": cannot find the shards of data.path ", data_path, " (", e.what(), ")");
    return "";
  }
  if (shards.empty()) return "";
  const fs::path folder = fs::path(shards.front()).parent_path() / "tokenizer";
  const std::string expected = data::TokenShardReader(shards.front()).meta().tokenizer_sha256;
  std::string file;
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (fs::is_regular_file(folder / name)) file = (folder / name).string();
  if (file.empty()) {
    log_warn("no tokenizer files in ", dir, ": ", folder.string(),
             " does not exist (shards written by an older "
             "h5tokenize); copy the tokenizer (tokenizer.model or tokenizer.json) into ",
             dir, " for AutoTokenizer.from_pretrained");
    return "";
  }
  const std::string got = data::sha256_file(file);
  if (!expected.empty() && got != expected) {
    log_warn("no tokenizer files in ", dir, ": ", file, " (sha256 ", got.substr(0, 12),
             "...) is not the tokenizer "
             "the shards were made with (",
             expected.substr(0, 12), "...)");
    return "";
  }
  const int n = copy_tokenizer_files(folder.string(), dir);
  return std::to_string(n) + " tokenizer file(s) from " + folder.string();
}

}  // namespace easyctx::ckpt
