// Helpers for the retrieval-evaluation tests: the tokenizers (the CI one made from the KJV,
// the Llama-2/3 fixtures), a byte-level tokenizer that always exists, a haystack text, and a
// scripted Session.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "data/tokenize/tokenizer.h"
#include "eval/retrieval.h"
#include "eval/session.h"
#include "train/train_test_util.h"

namespace easyctx::test {

// scripts/make_demo_tokenizer.sh's 2000-piece SentencePiece BPE (spm_train on the KJV), made
// once per test binary; "" when spm_train or bible is missing.
inline std::string demo_tokenizer() {
  static std::string path;
  static bool tried = false;
  if (!tried) {
    tried = true;
    static TempDir dir("needle-tok");
    const std::string cmd = "bash " + source_dir() + "/scripts/make_demo_tokenizer.sh " + dir.path() + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    if (p && pclose(p) == 0) {
      const std::vector<std::string> lines = split(trim(out), '\n');
      if (!lines.empty() && std::filesystem::exists(trim(lines.back()))) path = trim(lines.back());
    }
  }
  return path;
}
inline std::string llama2_tokenizer() { return shared_fixture("tokenizers/llama2/tokenizer.model"); }
inline std::string llama3_tokenizer() { return shared_fixture("tokenizers/llama3/tokenizer.json"); }

#define REQUIRE_TOKENIZER(path, what)                                                                       \
  if ((path).empty() || !std::filesystem::exists(path))                                                   \
  GTEST_SKIP() << what << " tokenizer " << (path.empty() ? std::string("(scripts/make_demo_tokenizer.sh)") : path) \
               << " is not available (spm_train/bible missing, or a clone without ../shared/fixtures); skipped"

// Bytes as ids (3 + byte); 0 unknown, 1 BOS, 2 EOS. Always available.
class ByteTokenizer : public data::Tokenizer {
 public:
  using data::Tokenizer::decode;
  using data::Tokenizer::encode;
  ByteTokenizer() {
    path_ = "byte-tokenizer";
    sha256_ = std::string(64, 'b');
  }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    for (unsigned char c : text) out.push_back(3u + c);
  }
  std::string decode(const uint32_t* ids, size_t n) const override {
    std::string s;
    for (size_t i = 0; i < n; ++i)
      if (ids[i] >= 3) s.push_back(static_cast<char>(ids[i] - 3));
    return s;
  }
  int64_t vocab_size() const override { return 259; }
  int64_t bos_id() const override { return 1; }
  int64_t eos_id() const override { return 2; }
  std::string kind() const override { return "byte"; }
};

// Sentences of words with . ? ! ends and commas, some paragraphs: a haystack text.
inline std::string haystack_text(uint64_t seed, size_t sentences) {
  static const char* words[] = {"river", "stone", "light", "morning", "garden", "winter", "silver", "harvest",
                                "mountain", "quiet", "road", "window", "lantern", "forest", "letter", "bridge",
                                "the", "a", "and", "of", "over", "under", "with", "without", "slowly", "brightly"};
  eval::Rng rng(seed);
  std::string s;
  for (size_t i = 0; i < sentences; ++i) {
    const size_t n = 4 + rng.below(10);
    std::string sent;
    for (size_t w = 0; w < n; ++w) {
      std::string word = words[rng.below(sizeof(words) / sizeof(words[0]))];
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      sent += (w ? " " : "") + word;
      if (w + 1 < n && rng.below(6) == 0) sent += ",";
    }
    const uint64_t e = rng.below(10);
    sent += e == 0 ? "?" : e == 1 ? "!" : ".";
    s += sent + (rng.below(8) == 0 ? "\n\n" : " ");
  }
  return s;
}

// A Session that scores nothing: it records the requests and answers by a rule of them.
class ScriptedSession : public eval::Session {
 public:
  std::vector<eval::ScoreRequest> seen;
  // Two prompts in three "retrieved", by a hash of the tokens.
  static bool verdict(const eval::ScoreRequest& r) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : r.tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return (h >> 17) % 3 != 0;
  }
  std::vector<std::vector<eval::SpanScore>> score_spans(const std::vector<eval::ScoreRequest>& requests) override {
    std::vector<std::vector<eval::SpanScore>> out;
    for (const auto& r : requests) {
      seen.push_back(r);
      std::vector<eval::SpanScore> s;
      for (const auto& sp : r.spans) {
        eval::SpanScore x;
        x.count = sp.length;
        x.all_argmax = verdict(r);
        s.push_back(x);
      }
      out.push_back(s);
    }
    return out;
  }
  int64_t vocab_size() const override { return 259; }
  int64_t bos_id() const override { return 1; }
  std::string describe() const override { return "scripted"; }
};

}  // namespace easyctx::test
