// Helpers for the retrieval-evaluation tests: the tokenizers (the CI one, spm_train on the
// KJV; the Llama-2/3 fixtures), a haystack text, and a small random model for sessions.
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

// scripts/make_demo_tokenizer.sh's 2000-piece SentencePiece BPE (spm_train on the KJV) in
// `dir` (made there once; about a second). Throws naming the script and its output when it
// cannot be made: spm_train and bible come with scripts/setup.sh, so a missing one is a
// failure, not a skip.
inline std::string make_demo_tokenizer(const std::string& dir) {
  // Under flock: test processes running at once share the folder.
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "flock " + dir + "/.lock bash " + source_dir() + "/scripts/make_demo_tokenizer.sh " + dir + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  const std::vector<std::string> lines = split(trim(out), '\n');
  const std::string path = lines.empty() ? "" : trim(lines.back());
  EASYCTX_CHECK(rc == 0 && std::filesystem::exists(path), "scripts/make_demo_tokenizer.sh ", dir, " failed (status ",
                rc, "; scripts/setup.sh installs spm_train and bible): ", out);
  return path;
}
// The CI tokenizer, made once per build (under ctest: in <build>/test-cache; it depends only
// on the KJV text and spm_train) or once per test binary elsewhere.
inline std::string demo_tokenizer() {
  static std::string path;
  if (path.empty()) {
    if (const char* bin = std::getenv("EASYCTX_BIN_DIR")) {
      path = make_demo_tokenizer(std::string(bin) + "/../test-cache/demo-tokenizer");
    } else {
      static TempDir dir("needle-tok");
      path = make_demo_tokenizer(dir.path());
    }
  }
  return path;
}
inline std::string llama2_tokenizer() { return shared_fixture("tokenizers/llama2/tokenizer.model"); }
inline std::string llama3_tokenizer() { return shared_fixture("tokenizers/llama3/tokenizer.json"); }

// The Llama tokenizer files are third-party fixtures beside the clone (ci_allowed_skips.txt:
// `fixtures`).
#define REQUIRE_FIXTURE_TOKENIZER(path, what) \
  if (!std::filesystem::exists(path))         \
  GTEST_SKIP() << what << " tokenizer " << (path) << " is not available (a clone without ../shared/fixtures)"

// Sentences of words with . ? ! ends and commas, some paragraphs: a haystack text.
inline std::string haystack_text(uint64_t seed, size_t sentences) {
  static const char* words[] = {"river",   "stone",    "light",   "morning", "garden",  "winter",  "silver",
                                "harvest", "mountain", "quiet",   "road",    "window",  "lantern", "forest",
                                "letter",  "bridge",   "the",     "a",       "and",     "of",      "over",
                                "under",   "with",     "without", "slowly",  "brightly"};
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

}  // namespace easyctx::test
