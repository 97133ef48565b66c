// The tokenizer of a Hugging Face export. h5tokenize keeps the tokenizer it used beside its
// shards, in <output>/tokenizer/: the tokenizer file (tokenizer.model for SentencePiece,
// tokenizer.json for a Hugging Face tokenizer) with the tokenizer_config.json and
// special_tokens_map.json transformers expects for Llama (docs/data.md). An export (the
// trainer's final/, easyctx_convert --to hf:) copies that folder's files next to the weights
// when the tokenizer file's sha256 is the one the shards record, so
// AutoTokenizer.from_pretrained(export) works; otherwise it warns, naming what is missing.
#pragma once
#include <string>

namespace easyctx::ckpt {

// The files a tokenizer folder may hold (what is copied, when present).
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                  "special_tokens_map.json"};

// Copies the tokenizer of the shards `data_path` names (a shard, a folder or a glob: the
// folder of its first shard holds tokenizer/) into `dir`. Returns what it did, for the log
// ("" when nothing was copied; a warning was logged then). Never throws for a missing or
// mismatching tokenizer: the weights are the export, the tokenizer a convenience.
std::string export_tokenizer_files(const std::string& data_path, const std::string& dir);

// Copies the tokenizer files of a Hugging Face folder `from` into `dir` (easyctx_convert
// --from hf: --to hf:); returns how many.
int copy_tokenizer_files(const std::string& from, const std::string& dir);

}  // namespace easyctx::ckpt
