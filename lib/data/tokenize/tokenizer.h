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
  // Whether the tokenizer's working memory is bounded by the longest pre-token, not by the
  // text (byte-level BPE: it cuts a pre-token longer than kMaxWordBytes, counted by
  // take_word_cuts): encode_pieces then never forces a cut.
  virtual bool memory_per_word() const { return false; }
  // Pre-tokens this thread cut since the last call (their tokens may differ at the cut).
  virtual size_t take_word_cuts() const { return 0; }
  static constexpr size_t kMaxWordBytes = size_t(256) << 10;
  // Id of a special token given by its text ("<|eot_id|>", "<|im_start|>"): an added token of
  // a tokenizer.json, a control or user-defined piece of a SentencePiece model; -1 if none.
  virtual int64_t special_id(std::string_view text) const = 0;

  // How a text cut at a space continues (probe_cut): the piece after the cut is encoded
  // without that space (SentencePiece adds its dummy-prefix "▁" back) or with it (byte-level
  // BPE); None: the tokenizer is never cut at a space.
  enum class Cut { DropSpace, KeepSpace, None };
  Cut cut() const { return cut_; }
  bool cuts_between_any_characters() const { return cut_any_; }  // rule 1 beyond ASCII (encode_pieces)
  bool cuts_after_line_breaks() const { return newline_cut_; }   // rule 2 (encode_pieces)

  // One piece of a text given to the tokenizer by encode_pieces: text[begin, end) gave the ids
  // out[ids_begin, ids_end). skip: bytes at `begin` not given to the tokenizer (the space of
  // a DropSpace cut, which the piece's dummy prefix stands for). continued: encoded as the
  // continuation of the text before it (encode_continued), not as a text of its own.
  struct Piece {
    size_t begin = 0, end = 0, skip = 0, ids_begin = 0, ids_end = 0;
    bool continued = false, forced = false;  // forced: the cut before it may change tokens
  };

  // Appends the ids of `text`, giving the tokenizer pieces of at most 4 x piece_bytes, so its
  // working memory (about 100 bytes per byte for SentencePiece) is bounded whatever the
  // text. Cuts, searched backward from piece_bytes, then forward to 4 x piece_bytes:
  //  1. a single space between two non-space characters: exact (no token spans it; probed
  //     on load, ASCII letters and digits only for a tokenizer that fails the wider probe);
  //  2. after a line break followed by a non-space character: exact where probed;
  //  3. otherwise (4 x piece_bytes of text with neither: a long word, base64, unspaced CJK)
  //     a forced cut at a character boundary, where the tokens next to the cut may differ
  //     from encoding the text whole. A tokenizer with memory_per_word() is never forced:
  //     its piece runs on to the next cut of rule 1 or 2 (it cuts only a pre-token longer
  //     than kMaxWordBytes, which counts as a forced cut too).
  // Returns the number of forced cuts (0: the ids are exactly encode(text)'s). pieces, when
  // given, receives the pieces in order.
  size_t encode_pieces(std::string_view text, std::vector<uint32_t>& out, size_t piece_bytes,
                       std::vector<Piece>* pieces = nullptr) const;
  // Appends the ids `text` has as the continuation of a text that ends just before it at a
  // token boundary (SentencePiece: without its dummy prefix "▁"; where the tokenizer cannot
  // do that, as encode()).
  void encode_continued(std::string_view text, std::vector<uint32_t>& out) const;
  // Encodes text[p.begin + p.skip, end) as piece p was encoded (end <= p.end).
  void encode_piece(std::string_view text, const Piece& p, size_t end, std::vector<uint32_t>& out) const;

  std::vector<uint32_t> encode(std::string_view text) const {
    std::vector<uint32_t> v;
    encode(text, v);
    return v;
  }
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }  // of the tokenizer file

 protected:
  // Sets the cut rules by comparing whole encodings with the pieces' (encode_pieces) on
  // several pairs of texts; a rule that fails is not used. Call at the end of a subclass's
  // constructor.
  void probe_cut();
  std::string path_, sha256_;
  Cut cut_ = Cut::None;
  bool cut_any_ = false;                   // rule 1 holds between any non-space characters, not only ASCII ones
  bool newline_cut_ = false;               // rule 2 holds
  bool continue_ok_ = false;               // encode_continued works (else it is encode)
  std::vector<uint32_t> continue_prefix_;  // SentencePiece: the ids of "\n", stripped by encode_continued

 private:
  size_t find_cut(std::string_view t, size_t s, size_t piece_bytes, bool& forced) const;
  bool is_space_cut(std::string_view t, size_t p) const;
  bool is_newline_cut(std::string_view t, size_t p) const;
};

// `*.json` -> Hugging Face BPE; anything else -> SentencePiece model. Throws InputError
// naming the file when it cannot be read or parsed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
std::unique_ptr<Tokenizer> load_hf_bpe(const std::string& path);

}  // namespace easyctx::data
