// Tokenizers for corpus preparation (h5tokenize) and inspection (h5inspect).
//   SentencePiece `.model` (Llama 2, Mistral) through libsentencepiece;
//   Hugging Face `tokenizer.json` byte-level BPE (Llama 3), implemented in bpe_tokenizer.cpp.
// encode() is const and safe to call from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace easyctx::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` (no BOS/EOS) to out. Text must be valid UTF-8.
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // Text of ids (special tokens are written as their text form).
  virtual std::string decode(const uint32_t* ids, size_t n) const = 0;
  virtual int64_t vocab_size() const = 0;  // every id produced is < vocab_size
  virtual int64_t bos_id() const = 0;      // -1: none
  virtual int64_t eos_id() const = 0;
  virtual std::string kind() const = 0;    // "sentencepiece" | "hf-bpe"

  std::vector<uint32_t> encode(std::string_view text) const {
    std::vector<uint32_t> v;
    encode(text, v);
    return v;
  }
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }  // of the tokenizer file

 protected:
  std::string path_, sha256_;
};

// `*.json` -> Hugging Face BPE; anything else -> SentencePiece model. Throws InputError
// naming the file when it cannot be read or parsed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
std::unique_ptr<Tokenizer> load_hf_bpe(const std::string& path);

}  // namespace easyctx::data
