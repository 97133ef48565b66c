#include "data/tokenize/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::data {

namespace {
bool ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
// A single space between two ASCII letters or digits.
bool is_cut(std::string_view t, size_t p) {
  return p > 0 && p + 1 < t.size() && t[p] == ' ' && ascii_alnum(t[p - 1]) && ascii_alnum(t[p + 1]);
}
}  // namespace

void Tokenizer::probe_cut() {
  static const char* const pairs[][2] = {{"hello", "world"}, {"The", "end"}, {"x", "9"}, {"2024", "ab"},
                                         {"a", "b"},         {"it's", "a"},  {"Q", "Z"}};
  bool drop = true, keep = true;
  for (const auto& pr : pairs) {
    const std::string a = pr[0], b = pr[1];
    const std::vector<uint32_t> whole = encode(a + " " + b);
    std::vector<uint32_t> d = encode(a), k = encode(a);
    encode(b, d);
    encode(" " + b, k);
    drop = drop && d == whole;
    keep = keep && k == whole;
  }
  cut_ = drop ? Cut::DropSpace : keep ? Cut::KeepSpace : Cut::None;
}

void Tokenizer::encode_pieces(std::string_view text, std::vector<uint32_t>& out, size_t piece_bytes) const {
  const size_t n = text.size();
  if (cut_ == Cut::None || piece_bytes == 0 || n <= piece_bytes) {
    encode(text, out);
    return;
  }
  size_t s = 0;
  while (s < n) {
    size_t end = n;
    if (n - s > piece_bytes) {
      // The last cut at or before s + piece_bytes, else the first one after it.
      size_t p = s + piece_bytes;
      while (p > s && !is_cut(text, p)) --p;
      if (p == s) {
        p = s + piece_bytes + 1;
        while (p < n && !is_cut(text, p)) ++p;
      }
      end = std::min(p, n);
    }
    encode(text.substr(s, end - s), out);
    if (end == n) break;
    s = cut_ == Cut::DropSpace ? end + 1 : end;
  }
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "tokenizer ", path,
                      " does not exist (expected a SentencePiece .model or a tokenizer.json)");
  if (ends_with(path, ".json")) return load_hf_bpe(path);
  return load_sentencepiece(path);
}

}  // namespace easyctx::data
