// SentencePiece models through libsentencepiece (the same code spm_encode runs, so ids match
// spm_encode --output_format=id exactly).
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/sha256.h"
#include "data/tokenize/tokenizer.h"

namespace easyctx::data {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    path_ = path;
    sha256_ = sha256_file(path);  // also fails clearly when the file is unreadable
    auto st = sp_.Load(path);
    EASYCTX_CHECK_INPUT(st.ok(), "cannot load SentencePiece model ", path, ": ", st.ToString(),
                        " (expected a .model file, or a Hugging Face tokenizer.json)");
    probe_cut();
  }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    EASYCTX_CHECK(st.ok(), "SentencePiece encode failed (", path_, "): ", st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(const uint32_t* ids, size_t n) const override {
    std::vector<int> v(ids, ids + n);
    for (int& id : v)
      EASYCTX_CHECK_INPUT(id >= 0 && id < sp_.GetPieceSize(), "decode: id ", id, " outside the vocabulary of ", path_);
    std::string text;
    auto st = sp_.Decode(v, &text);
    EASYCTX_CHECK(st.ok(), "SentencePiece decode failed (", path_, "): ", st.ToString());
    return text;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t bos_id() const override { return sp_.bos_id(); }
  int64_t eos_id() const override { return sp_.eos_id(); }
  std::string kind() const override { return "sentencepiece"; }
  int64_t special_id(std::string_view text) const override {
    const int id = sp_.PieceToId(text);
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IdToPiece(id) != text) return -1;
    if (sp_.IsControl(id)) return id;
    // A user-defined symbol (libsentencepiece here has no IsUserDefined) is always one piece.
    std::vector<int> ids;
    if (!sp_.Encode(text, &ids).ok()) return -1;
    return (!ids.empty() && ids.back() == id &&
            (ids.size() == 1 || (ids.size() == 2 && sp_.IdToPiece(ids[0]) == "\xe2\x96\x81")))
               ? id
               : -1;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace easyctx::data
