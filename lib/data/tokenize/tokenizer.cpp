#include "data/tokenize/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::data {

namespace {
bool ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// Unicode White_Space (what PCRE2's \s matches with UCP, and more).
bool is_space_cp(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 ||
         c == 0xFEFF;
}

// The code point starting at byte p (a lead byte; invalid sequences read as 0xFFFD).
uint32_t cp_at(std::string_view t, size_t p) {
  const auto b = static_cast<unsigned char>(t[p]);
  if (b < 0x80) return b;
  const int len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || p + len > t.size()) return 0xFFFD;
  uint32_t c = b & (0x7F >> len);
  for (int i = 1; i < len; ++i) c = (c << 6) | (static_cast<unsigned char>(t[p + i]) & 0x3F);
  return c;
}

// The code point ending just before byte p (p > 0).
uint32_t cp_before(std::string_view t, size_t p) {
  size_t q = p - 1;
  while (q > 0 && p - q < 4 && (static_cast<unsigned char>(t[q]) & 0xC0) == 0x80) --q;
  return cp_at(t, q);
}

bool continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }
}  // namespace

bool Tokenizer::is_space_cut(std::string_view t, size_t p) const {
  if (cut_ == Cut::None || p == 0 || p + 1 >= t.size() || t[p] != ' ') return false;
  if (!cut_any_) return ascii_alnum(t[p - 1]) && ascii_alnum(t[p + 1]);
  return !is_space_cp(cp_before(t, p)) && !is_space_cp(cp_at(t, p + 1));
}

bool Tokenizer::is_newline_cut(std::string_view t, size_t p) const {
  return newline_cut_ && p > 0 && p < t.size() && t[p - 1] == '\n' && !continuation_byte(t[p]) &&
         !is_space_cp(cp_at(t, p));
}

void Tokenizer::probe_cut() {
  static const char* const ascii[][2] = {{"hello", "world"}, {"The", "end"}, {"x", "9"}, {"2024", "ab"},
                                         {"a", "b"},         {"it's", "a"},  {"Q", "Z"}};
  static const char* const wide[][2] = {{"Привет", "мир"}, {"日本", "語"}, {"é", "ü"},  {"(", ")"},
                                        {"🙂", "x"},     {"a.", "b"},    {"x", "-y"}, {"1,", "2"}};
  const auto holds = [&](const char* const(*pairs)[2], size_t n, bool drop) {
    for (size_t i = 0; i < n; ++i) {
      const std::string a = pairs[i][0], b = pairs[i][1];
      std::vector<uint32_t> v = encode(a);
      encode(drop ? b : " " + b, v);
      if (v != encode(a + " " + b)) return false;
    }
    return true;
  };
  const bool drop = holds(ascii, std::size(ascii), true), keep = !drop && holds(ascii, std::size(ascii), false);
  cut_ = drop ? Cut::DropSpace : keep ? Cut::KeepSpace : Cut::None;
  cut_any_ = cut_ != Cut::None && holds(wide, std::size(wide), drop);
  // A continuation: SentencePiece encodes "\n" + text and drops the ids of "\n" (no dummy
  // prefix before the text); byte-level BPE has no prefix to drop.
  continue_prefix_.clear();
  continue_ok_ = true;
  if (cut_ != Cut::KeepSpace) {
    continue_prefix_ = encode("\n");
    continue_ok_ = !continue_prefix_.empty();
  }
  static const char* const lines[][2] = {{"a\n", "b"}, {"x.\n\n", "Y"},  {"日本\n", "語"},
                                         {"1\n", "2"}, {"end\n", "(x)"}, {"hello world\n", "Hi"}};
  newline_cut_ = continue_ok_;
  for (const auto& pr : lines) {
    std::vector<uint32_t> v = encode(pr[0]);
    encode_continued(pr[1], v);
    newline_cut_ = newline_cut_ && v == encode(std::string(pr[0]) + pr[1]);
  }
}

void Tokenizer::encode_continued(std::string_view text, std::vector<uint32_t>& out) const {
  if (!continue_ok_ || continue_prefix_.empty()) {
    encode(text, out);
    return;
  }
  std::string t;
  t.reserve(text.size() + 1);
  t += '\n';
  t.append(text);
  std::vector<uint32_t> ids;
  encode(t, ids);
  const size_t k = continue_prefix_.size();
  if (ids.size() >= k && std::equal(continue_prefix_.begin(), continue_prefix_.end(), ids.begin()))
    out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end());
  else encode(text, out);
}

void Tokenizer::encode_piece(std::string_view text, const Piece& p, size_t end, std::vector<uint32_t>& out) const {
  const size_t b = std::min(p.begin + p.skip, end);
  if (p.continued) encode_continued(text.substr(b, end - b), out);
  else encode(text.substr(b, end - b), out);
}

// The start of the next piece after the one starting at s (text.size(): the rest is one piece).
size_t Tokenizer::find_cut(std::string_view t, size_t s, size_t piece_bytes, bool& forced) const {
  forced = false;
  const size_t n = t.size();
  if (n - s <= piece_bytes) return n;
  const auto cut_at = [&](size_t p) { return is_space_cut(t, p) || is_newline_cut(t, p); };
  for (size_t p = s + piece_bytes; p > s; --p)
    if (cut_at(p)) return p;
  // A tokenizer whose memory is bounded per pre-token (byte-level BPE) is never forced.
  const size_t far = n - s <= 4 * piece_bytes || memory_per_word() ? n : s + 4 * piece_bytes;
  for (size_t p = s + piece_bytes + 1; p < far; ++p)
    if (cut_at(p)) return p;
  if (far == n) return n;
  size_t p = s + piece_bytes;
  while (p > s + 1 && continuation_byte(t[p])) --p;
  forced = true;
  return p;
}

size_t Tokenizer::encode_pieces(std::string_view text, std::vector<uint32_t>& out, size_t piece_bytes,
                                std::vector<Piece>* pieces) const {
  const size_t n = text.size();
  if (piece_bytes == 0) piece_bytes = n;
  size_t forced_cuts = 0;
  Piece cur;
  while (true) {
    bool forced = false;
    const size_t next = find_cut(text, cur.begin + cur.skip, piece_bytes, forced);
    cur.end = next;
    cur.ids_begin = out.size();
    encode_piece(text, cur, next, out);
    cur.ids_end = out.size();
    if (pieces) pieces->push_back(cur);
    if (next >= n) break;
    Piece nx;
    nx.begin = next;
    nx.forced = forced;
    forced_cuts += forced ? 1 : 0;
    if (!forced && is_space_cut(text, next)) {
      nx.skip = cut_ == Cut::DropSpace ? 1 : 0;
    } else {
      nx.continued = true;  // a line-break or forced cut
    }
    cur = nx;
  }
  return forced_cuts + take_word_cuts();
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "tokenizer ", path,
                      " does not exist (expected a SentencePiece .model or a tokenizer.json)");
  if (ends_with(path, ".json")) return load_hf_bpe(path);
  return load_sentencepiece(path);
}

}  // namespace easyctx::data
