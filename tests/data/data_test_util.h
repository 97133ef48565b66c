// Helpers for the data tests: scratch folders, random shards, running commands.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/shard.h"
#include "test_util.h"

namespace easyctx::test {

// A fresh folder under $TMPDIR (or /tmp), removed on destruction unless the test failed.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag);
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a shard of random documents (lengths in [1, max_doc]) with ids in [0, vocab);
// returns the concatenated tokens.
std::vector<uint32_t> write_random_shard(const std::string& path, std::mt19937_64& rng, uint64_t docs, uint64_t max_doc,
                                         int64_t vocab, const std::string& sha = "");

// A byte-level BPE tokenizer.json as Hugging Face writes one: GPT-2's byte alphabet (ids 0..255
// by byte value), then one id per merge ("left right") in order; text is split by `regex`
// (Split, Isolated) before the byte-level step. `end_token`, when given, is an added special
// token with the next id.
std::string byte_level_bpe_json(const std::vector<std::string>& merges, bool ignore_merges, const std::string& regex,
                                const std::string& end_token = "");

// A byte-level BPE tokenizer.json without merges (the id of a byte is its value) plus the
// ChatML special tokens <|im_start|> = 256 and <|im_end|> = 257 (vocab 258): every id of a
// chatml rendering is checkable by hand.
std::string chatml_byte_tokenizer_json();

// The Llama tokenizer fixtures beside the clone (CI has them: .ci/run requires them).
inline std::string llama2_path() { return shared_fixture("tokenizers/llama2/tokenizer.model"); }
inline std::string llama3_path() { return shared_fixture("tokenizers/llama3/tokenizer.json"); }

struct CommandResult {
  int status = -1;     // exit code
  std::string output;  // stdout + stderr
};
CommandResult run_command(const std::string& cmd);
bool have_program(const std::string& name);
std::string read_text(const std::string& path);
// A Hugging Face tokenizer.json of a byte-level BPE: `vocab` and `merges` as the model's,
// pre-tokenized by a Split on `regex` (isolated) then ByteLevel without a prefix space, with
// `added_tokens` (an array of {id, content, ...}) and no normalizer.
std::string byte_level_bpe_json(const Json& vocab, const Json& merges, bool ignore_merges, const std::string& regex,
                                const Json& added_tokens);
void write_text(const std::string& path, const std::string& text);

}  // namespace easyctx::test

// Ends the test as skipped when a tokenizer fixture is absent (ctest reports it as skipped;
// .ci/run fails first, so CI never skips these).
#define REQUIRE_FIXTURE(path)                                                                                    \
  do {                                                                                                           \
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "tokenizer fixture " << (path) << " is absent; skipped"; \
  } while (0)
