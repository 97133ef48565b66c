// Hugging Face `tokenizer.json` byte-level BPE (the Llama 3 family), implemented here:
//  1. added tokens (specials) are cut out of the text first (leftmost, longest match), as
//     HF's AddedVocabulary does for `tokenizer(text)`;
//  2. the Split pre-tokenizer regex runs through PCRE2 (UTF + UCP, JIT), behaviour Isolated:
//     every match and every unmatched gap is a pre-token;
//  3. ByteLevel maps each byte of a pre-token to its printable code point (GPT-2's
//     bytes_to_unicode table);
//  4. BPE: with ignore_merges a pre-token found whole in the vocab is one token; otherwise
//     the pair of lowest merge rank (leftmost on ties) is merged until none applies.
// Decoding maps token strings back through the inverse byte table.
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/sha256.h"
#include "data/tokenize/tokenizer.h"
#include "data/tokenize/utf8.h"

namespace easyctx::data {
namespace {

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to 256+n.
std::vector<uint32_t> byte_to_codepoint() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return cp;
}

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() {
    if (code) pcre2_code_free(code);
  }
};

class HfBpeTokenizer : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path);
  ~HfBpeTokenizer() override = default;
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  std::string decode(const uint32_t* ids, size_t n) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t bos_id() const override { return bos_; }
  int64_t eos_id() const override { return eos_; }
  std::string kind() const override { return "hf-bpe"; }
  bool memory_per_word() const override { return true; }
  size_t take_word_cuts() const override {
    const size_t n = word_cuts_;
    word_cuts_ = 0;
    return n;
  }
  int64_t special_id(std::string_view text) const override {
    for (const auto& a : added_)
      if (a.first == text) return a.second;
    return -1;
  }

 private:
  void load_model(const Json& model);
  void load_added(const Json& added);
  void load_pretokenizer(const Json& pre);
  void encode_segment(std::string_view text, std::vector<uint32_t>& out) const;
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;
  void encode_long_word(std::string_view word, std::vector<uint32_t>& out) const;
  void bpe(const std::string& mapped, std::vector<uint32_t>& out) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> is_added_;
  struct MergeInfo {
    uint32_t rank, merged;
  };
  std::unordered_map<uint64_t, MergeInfo> merges_;  // (left << 32 | right) -> rank, result
  std::vector<std::string> byte_str_;               // byte -> its mapped UTF-8 string
  std::vector<uint32_t> byte_id_;                   // byte -> id of its single-char token
  std::unordered_map<uint32_t, uint8_t> cp_to_byte_;
  std::vector<std::pair<std::string, uint32_t>> added_;  // longest first
  bool added_first_byte_[256] = {};                      // bytes that can start an added token
  bool ignore_merges_ = false;
  bool regex_looks_back_ = false;  // the pre-tokenizer regex may look before a match's start
  Pcre2Code re_;
  int64_t vocab_size_ = 0, bos_ = -1, eos_ = -1;
  // Unique per object (an address can be reused by a later tokenizer): keys the cache.
  const uint64_t instance_ = next_instance_.fetch_add(1) + 1;
  static std::atomic<uint64_t> next_instance_;
  static thread_local size_t word_cuts_;
};

std::atomic<uint64_t> HfBpeTokenizer::next_instance_{0};
thread_local size_t HfBpeTokenizer::word_cuts_ = 0;

// What a JSON file that is not a supported tokenizer.json holds, for the error message.
std::string describe_json(const Json& j) {
  if (!j.is_object()) return std::string("a JSON ") + j.type_name();
  if (j.as_object().empty()) return "an empty JSON object";
  std::string keys;
  size_t k = 0;
  for (const auto& kv : j.as_object()) {
    if (k++ == 8) {
      keys += ", ...";
      break;
    }
    keys += (keys.empty() ? "" : ", ") + kv.first;
  }
  std::string s = "a JSON object with keys " + keys;
  if (j.find("chat_template") || j.find("tokenizer_class") || j.find("model_max_length"))
    s += " (a tokenizer_config.json? the vocabulary is in tokenizer.json beside it)";
  else if (j.find("architectures") || j.find("hidden_size"))
    s += " (a model's config.json? the vocabulary is in tokenizer.json beside it)";
  return s;
}

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) {
  path_ = path;
  sha256_ = sha256_file(path);
  Json j = parse_json(read_file(path), path);
  const Json* mp = j.is_object() ? j.find("model") : nullptr;
  EASYCTX_CHECK_INPUT(mp && mp->is_object() && mp->find("vocab") && mp->find("merges"), path,
                      " is not a Hugging Face tokenizer.json of a supported kind (byte-level BPE, as Llama 3's: an "
                      "object whose \"model\" has \"type\": \"BPE\", \"vocab\" and \"merges\"); found ",
                      mp && mp->is_object() ? "a \"model\" without vocab and merges" : describe_json(j),
                      ". Pass the tokenizer.json of a Hugging Face model folder, or a SentencePiece .model");
  const Json& model = *mp;
  const Json* type = model.find("type");
  EASYCTX_CHECK_INPUT(type && type->is_string() && type->as_string() == "BPE", path, ": model.type is ",
                      type ? type->dump() : std::string("absent"),
                      ", expected \"BPE\" (only byte-level BPE tokenizer.json files are supported; for a "
                      "SentencePiece model pass its .model file)");
  load_model(model);
  if (const Json* a = j.find("added_tokens"); a && a->is_array()) load_added(*a);
  const Json* norm = j.find("normalizer");
  EASYCTX_CHECK_INPUT(!norm || norm->is_null(), path,
                      ": normalizers are not supported (expected \"normalizer\": null)");
  const Json* pre = j.find("pre_tokenizer");
  EASYCTX_CHECK_INPUT(pre && !pre->is_null(), path, ": pre_tokenizer is missing");
  load_pretokenizer(*pre);
  vocab_size_ = static_cast<int64_t>(id_to_token_.size());
  for (const char* b : {"<|begin_of_text|>", "<s>", "<bos>"})
    if (bos_ < 0 && vocab_.count(b)) bos_ = vocab_.at(b);
  for (const char* e : {"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"})
    if (eos_ < 0 && vocab_.count(e)) eos_ = vocab_.at(e);
  probe_cut();
  // Cutting before a space (after a line break) is exact when no added token spans a space
  // (a line break) and the regex looks only forward from where a match starts (no lookbehind
  // or word boundary).
  for (const auto& a : added_) {
    if (a.first.find(' ') != std::string::npos) cut_ = Cut::None;
    if (a.first.find('\n') != std::string::npos) newline_cut_ = false;
  }
  if (regex_looks_back_) {
    cut_ = Cut::None;
    newline_cut_ = false;
  }
  cut_any_ = cut_any_ && cut_ != Cut::None;
}

void HfBpeTokenizer::load_model(const Json& model) {
  if (const Json* im = model.find("ignore_merges"); im && im->is_bool()) ignore_merges_ = im->as_bool();
  if (const Json* bf = model.find("byte_fallback"); bf && bf->is_bool())
    EASYCTX_CHECK_INPUT(!bf->as_bool(), path_, ": byte_fallback BPE is not supported (byte-level BPE expected)");
  for (const auto& [tok, idj] : model.at("vocab").as_object()) {
    int64_t id = idj.as_int();
    EASYCTX_CHECK_INPUT(id >= 0 && id < (int64_t(1) << 31), path_, ": vocab id ", id, " of ", tok, " out of range");
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = tok;
    vocab_[tok] = static_cast<uint32_t>(id);
  }
  std::vector<uint32_t> cps = byte_to_codepoint();
  byte_str_.resize(256);
  byte_id_.resize(256);
  for (int b = 0; b < 256; ++b) {
    append_utf8(byte_str_[b], cps[b]);
    cp_to_byte_[cps[b]] = static_cast<uint8_t>(b);
    auto it = vocab_.find(byte_str_[b]);
    EASYCTX_CHECK_INPUT(it != vocab_.end(), path_, ": byte-level token for byte ", b, " is missing from the vocab");
    byte_id_[b] = it->second;
  }
  const auto& merges = model.at("merges").as_array();
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    if (merges[r].is_string()) {
      const std::string& m = merges[r].as_string();
      size_t sp = m.find(' ');
      EASYCTX_CHECK_INPUT(sp != std::string::npos, path_, ": merge ", r, " '", m, "' is not \"left right\"");
      a = m.substr(0, sp);
      b = m.substr(sp + 1);
    } else {
      a = merges[r][0].as_string();
      b = merges[r][1].as_string();
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    EASYCTX_CHECK_INPUT(ia != vocab_.end() && ib != vocab_.end() && im != vocab_.end(), path_, ": merge ", r, " (", a,
                        " ", b, ") names a token missing from the vocab");
    uint64_t key = (uint64_t(ia->second) << 32) | ib->second;
    merges_.emplace(key, MergeInfo{static_cast<uint32_t>(r), im->second});  // first (lowest rank) wins
  }
}

void HfBpeTokenizer::load_added(const Json& added) {
  for (const Json& t : added.as_array()) {
    std::string content = t.at("content").as_string();
    int64_t id = t.at("id").as_int();
    EASYCTX_CHECK_INPUT(id >= 0 && id < (int64_t(1) << 31) && !content.empty(), path_, ": bad added token ", content);
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = content;
    if (is_added_.size() < id_to_token_.size()) is_added_.resize(id_to_token_.size(), false);
    is_added_[id] = true;
    vocab_[content] = static_cast<uint32_t>(id);
    added_.emplace_back(content, static_cast<uint32_t>(id));
    added_first_byte_[static_cast<unsigned char>(content[0])] = true;
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
}

void HfBpeTokenizer::load_pretokenizer(const Json& pre) {
  // Expected: Sequence[Split(Regex, Isolated, invert false), ByteLevel(add_prefix_space
  // false, use_regex false)] as in Llama 3; anything else is refused rather than guessed.
  std::string pattern;
  bool byte_level = false;
  auto visit = [&](const Json& p, auto& self) -> void {
    const std::string& type = p.at("type").as_string();
    if (type == "Sequence") {
      for (const Json& q : p.at("pretokenizers").as_array()) self(q, self);
    } else if (type == "Split") {
      EASYCTX_CHECK_INPUT(p.at("behavior").as_string() == "Isolated" && !p.at("invert").as_bool(), path_,
                          ": only Split with behavior Isolated, invert false is supported");
      pattern = p.at("pattern").at("Regex").as_string();
    } else if (type == "ByteLevel") {
      EASYCTX_CHECK_INPUT(!p.at("add_prefix_space").as_bool(), path_, ": ByteLevel add_prefix_space is not supported");
      if (const Json* ur = p.find("use_regex"); ur && ur->as_bool()) {
        EASYCTX_CHECK_INPUT(pattern.empty(), path_, ": ByteLevel use_regex after a Split is not supported");
        pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
      }
      byte_level = true;
    } else {
      EASYCTX_THROW_INPUT(path_, ": pre-tokenizer type ", type, " is not supported");
    }
  };
  visit(pre, visit);
  EASYCTX_CHECK_INPUT(byte_level && !pattern.empty(), path_, ": expected a Split regex and a ByteLevel pre-tokenizer");
  for (const char* back : {"(?<", "\\b", "\\B", "\\G", "\\K"})
    if (pattern.find(back) != std::string::npos) regex_looks_back_ = true;
  int err = 0;
  PCRE2_SIZE off = 0;
  re_.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                           &off, nullptr);
  if (!re_.code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    EASYCTX_THROW_INPUT(path_, ": cannot compile the pre-tokenizer regex at offset ", off, ": ",
                        reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation: when unavailable the interpreter gives the same matches.
  (void)pcre2_jit_compile(re_.code, PCRE2_JIT_COMPLETE);
}

void HfBpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, uint32_t>* hit = nullptr;
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    for (const auto& a : added_)  // longest first, so the first hit is the longest
      if (text.compare(i, a.first.size(), a.first) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    encode_segment(text.substr(seg, i - seg), out);
    out.push_back(hit->second);
    i += hit->first.size();
    seg = i;
  }
  encode_segment(text.substr(seg), out);
}

struct MatchData {
  pcre2_match_data* md = nullptr;
  ~MatchData() {
    if (md) pcre2_match_data_free(md);
  }
};

void HfBpeTokenizer::encode_segment(std::string_view text, std::vector<uint32_t>& out) const {
  if (text.empty()) return;
  thread_local MatchData md;
  if (!md.md) md.md = pcre2_match_data_create(1, nullptr);
  EASYCTX_CHECK(md.md, "pcre2_match_data_create: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re_.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      EASYCTX_THROW("pre-tokenizer regex failed (", path_, "): ", reinterpret_cast<const char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
    size_t b = ov[0], e = ov[1];
    if (b > pos) encode_long_word(text.substr(pos, b - pos), out);  // Isolated: gaps are pieces too
    if (e == b) {  // empty match: step over one code point so the loop advances
      size_t next = b + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      encode_word(text.substr(b, next - b), out);
      pos = next;
      continue;
    }
    encode_long_word(text.substr(b, e - b), out);
    pos = e;
  }
  if (pos < text.size()) encode_long_word(text.substr(pos), out);
}

// A pre-token longer than kMaxWordBytes (a run of letters or of punctuation with nothing
// between) is cut into words of at most that size at character boundaries: BPE's memory is
// about 60 bytes per byte of a word. Tokens next to such a cut may differ from HF's.
void HfBpeTokenizer::encode_long_word(std::string_view word, std::vector<uint32_t>& out) const {
  while (word.size() > kMaxWordBytes) {
    size_t p = kMaxWordBytes;
    while (p > 1 && (static_cast<unsigned char>(word[p]) & 0xC0) == 0x80) --p;
    encode_word(word.substr(0, p), out);
    word.remove_prefix(p);
    ++word_cuts_;
  }
  encode_word(word, out);
}

void HfBpeTokenizer::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  // Per-thread cache of pre-token -> ids; cleared when it grows large or the tokenizer changes.
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<uint32_t>> map;
  };
  thread_local Cache cache;
  if (cache.owner != instance_ || cache.map.size() > (1u << 18)) {
    cache.map.clear();
    cache.owner = instance_;
  }
  std::string key(word);
  auto it = cache.map.find(key);
  if (it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::string mapped;
  mapped.reserve(word.size() * 2);
  for (unsigned char c : word) mapped += byte_str_[c];
  std::vector<uint32_t> ids;
  auto whole = ignore_merges_ ? vocab_.find(mapped) : vocab_.end();
  if (whole != vocab_.end()) {
    ids.push_back(whole->second);
  } else {
    std::vector<uint32_t> syms;
    for (unsigned char c : word) syms.push_back(byte_id_[c]);
    ids = std::move(syms);
    bpe(mapped, ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() <= 256) cache.map.emplace(std::move(key), std::move(ids));
}

// In: `ids` = one id per byte. Out: merged ids. Heap of candidate pairs ordered by (rank,
// position); stale entries are skipped on pop. O(n log n), as HF's Word::merge_all.
void HfBpeTokenizer::bpe(const std::string& /*mapped*/, std::vector<uint32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    uint32_t rank;
    int pos;
    uint32_t left, right;
  };
  auto cmp = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> heap(cmp);
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto m = merges_.find((uint64_t(ids[i]) << 32) | ids[next[i]]);
    if (m != merges_.end()) heap.push({m->second.rank, i, ids[i], ids[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int i = c.pos;
    if (!alive[i] || next[i] < 0 || ids[i] != c.left || ids[next[i]] != c.right) continue;
    int j = next[i];
    ids[i] = merges_.at((uint64_t(c.left) << 32) | c.right).merged;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  std::vector<uint32_t> merged;
  for (int i = 0; i >= 0; i = next[i]) merged.push_back(ids[i]);
  ids = std::move(merged);
}

std::string HfBpeTokenizer::decode(const uint32_t* ids, size_t n) const {
  std::string out;
  for (size_t k = 0; k < n; ++k) {
    uint32_t id = ids[k];
    EASYCTX_CHECK_INPUT(id < id_to_token_.size(), "decode: id ", id, " outside the vocabulary of ", path_);
    const std::string& tok = id_to_token_[id];
    if (id < is_added_.size() && is_added_[id]) {
      out += tok;
      continue;
    }
    // Token text is UTF-8 of byte-level code points; map each back to its byte.
    size_t i = 0;
    while (i < tok.size()) {
      auto c = static_cast<unsigned char>(tok[i]);
      int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
      uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
      for (int q = 1; q < len && i + q < tok.size(); ++q) cp = (cp << 6) | (tok[i + q] & 0x3F);
      auto b = cp_to_byte_.find(cp);
      if (b != cp_to_byte_.end()) out.push_back(static_cast<char>(b->second));
      else out.append(tok, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_bpe(const std::string& path) { return std::make_unique<HfBpeTokenizer>(path); }

}  // namespace easyctx::data
