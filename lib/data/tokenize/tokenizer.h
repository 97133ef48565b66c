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
  virtual std::string kind() const = 0;  // "sentencepiece" | "hf-bpe"
  // Id of a special token given by its text ("<|eot_id|>", "<|im_start|>"): an added token of
  // a tokenizer.json, a control or user-defined piece of a SentencePiece model; -1 if none.
  virtual int64_t special_id(std::string_view text) const = 0;

  // How a text cut at a space continues (probe_cut): the piece after the cut is encoded
  // without that space (SentencePiece adds its dummy-prefix "▁" back) or with it (byte-level
  // BPE); None: the tokenizer is never cut.
  enum class Cut { DropSpace, KeepSpace, None };
  Cut cut() const { return cut_; }

  // Appends exactly the ids encode(text) appends, giving the tokenizer pieces of about
  // `piece_bytes` at a time, so its working memory (about 100 bytes per byte of text for
  // SentencePiece) is bounded by the piece, not by the document. Cuts only at a single space
  // between two ASCII letters or digits: SentencePiece words and byte-level pre-tokens both
  // start at such a space, so no token spans it. A text with no such space within reach is
  // given in a larger piece (whole when it has none).
  void encode_pieces(std::string_view text, std::vector<uint32_t>& out, size_t piece_bytes) const;

  std::vector<uint32_t> encode(std::string_view text) const {
    std::vector<uint32_t> v;
    encode(text, v);
    return v;
  }
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }  // of the tokenizer file

 protected:
  // Sets cut_ by comparing encode("a b") with the two ways of encoding "a" and "b" apart, on
  // several pairs; a tokenizer that matches neither is never cut. Call at the end of a
  // subclass's constructor.
  void probe_cut();
  std::string path_, sha256_;
  Cut cut_ = Cut::None;
};

// `*.json` -> Hugging Face BPE; anything else -> SentencePiece model. Throws InputError
// naming the file when it cannot be read or parsed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
std::unique_ptr<Tokenizer> load_hf_bpe(const std::string& path);

}  // namespace easyctx::data
