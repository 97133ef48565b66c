#include "data_test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"

namespace easyctx::test {
namespace fs = std::filesystem;

ScratchDir::ScratchDir(const std::string& tag) {
  const char* t = std::getenv("TMPDIR");
  std::string base = t ? t : "/tmp";
  static std::random_device rd;
  path_ = base + "/easyctx-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  fs::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info && info->result()->Failed()) {
    std::fprintf(stderr, "kept scratch folder %s for inspection\n", path_.c_str());
    return;
  }
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<uint32_t> write_random_shard(const std::string& path, std::mt19937_64& rng, uint64_t docs, uint64_t max_doc,
                                         int64_t vocab, const std::string& sha) {
  data::ShardMeta m;
  m.tokenizer_sha256 = sha.empty() ? std::string(64, 'a') : sha;
  m.tokenizer_name = "random";
  m.vocab_size = vocab;
  m.bos_id = 1;
  m.eos_id = 2;
  data::TokenShardWriter w(path, m, 97);  // small odd chunk: reads cross chunk edges
  std::uniform_int_distribution<uint64_t> len(1, max_doc);
  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(vocab - 1));
  std::vector<uint32_t> all;
  const char* names[] = {"RedPajamaBook", "RedPajamaC4", "RedPajamaArXiv"};
  for (uint64_t d = 0; d < docs; ++d) {
    std::vector<uint32_t> doc(len(rng));
    for (auto& x : doc) x = id(rng);
    w.add_document(doc.data(), doc.size(), w.source_index(names[rng() % 3]));
    all.insert(all.end(), doc.begin(), doc.end());
  }
  w.commit();
  return all;
}

CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

bool have_program(const std::string& name) { return run_command("command -v " + name).status == 0; }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  EASYCTX_CHECK(f.good(), "cannot write ", path);
}

std::string byte_level_bpe_json(const Json& vocab, const Json& merges, bool ignore_merges, const std::string& regex,
                                const Json& added_tokens) {
  Json model = Json::object();
  model.set("type", "BPE");
  model.set("ignore_merges", ignore_merges);
  model.set("byte_fallback", false);
  model.set("vocab", vocab);
  model.set("merges", merges);
  Json pat = Json::object();
  pat.set("Regex", regex);
  Json split = Json::object();
  split.set("type", "Split");
  split.set("pattern", pat);
  split.set("behavior", "Isolated");
  split.set("invert", false);
  Json bl = Json::object();
  bl.set("type", "ByteLevel");
  bl.set("add_prefix_space", false);
  bl.set("use_regex", false);
  Json pts = Json::array();
  pts.push_back(split);
  pts.push_back(bl);
  Json seq = Json::object();
  seq.set("type", "Sequence");
  seq.set("pretokenizers", pts);
  Json j = Json::object();
  j.set("added_tokens", added_tokens);
  j.set("normalizer", nullptr);
  j.set("pre_tokenizer", seq);
  j.set("model", model);
  return j.dump();
}

std::string byte_level_bpe_json(const std::vector<std::string>& merges, bool ignore_merges, const std::string& regex,
                                const std::string& end_token) {
  // bytes_to_unicode: printable bytes map to themselves, the rest to 256+n in byte order.
  std::vector<std::string> byte_tok(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(byte_tok[b], direct ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
  }
  Json vocab = Json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab.set(byte_tok[b], id++);
  Json m = Json::array();
  for (const std::string& mg : merges) {
    const size_t sp = mg.find(' ');
    vocab.set(mg.substr(0, sp) + mg.substr(sp + 1), id++);
    m.push_back(mg);
  }
  Json added = Json::array();
  if (!end_token.empty()) added.push_back(Json::object({{"id", id}, {"content", end_token}}));
  return byte_level_bpe_json(vocab, m, ignore_merges, regex, added);
}

std::string chatml_byte_tokenizer_json() {
  Json vocab = Json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    std::string s;
    append_utf8(s, direct ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
    vocab.set(s, b);
  }
  Json added = Json::array();
  for (auto [text, id] : {std::pair<const char*, int>{"<|im_start|>", 256}, {"<|im_end|>", 257}}) {
    Json t = Json::object();
    t.set("id", id);
    t.set("content", text);
    t.set("special", true);
    added.push_back(t);
  }
  return byte_level_bpe_json(vocab, Json::array(), false, " ?\\p{L}+|\\s+|[^\\s\\p{L}]+", added);
}

}  // namespace easyctx::test
