#include "data/tokenize/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "tokenizer ", path,
                      " does not exist (expected a SentencePiece .model or a tokenizer.json)");
  if (ends_with(path, ".json")) return load_hf_bpe(path);
  return load_sentencepiece(path);
}

}  // namespace easyctx::data
