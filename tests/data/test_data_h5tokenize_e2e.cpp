// End-to-end runs of h5tokenize and h5inspect: ids equal spm_encode's plus BOS on KJV text,
// malformed input handling, truncated zstd, h5dump readability, resume and rank-count
// independence, upsampling, and the Llama 3 tokenizer through the whole pipeline.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "core/json.h"
#include "core/strings.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenize/chat.h"
#include "data/tokenize/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::CommandResult;
using easyctx::test::run_command;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {
std::string bin(const std::string& name) { return easyctx::test::bin_dir() + "/" + name; }
std::string llama2() { return easyctx::test::shared_fixture("tokenizers/llama2/tokenizer.model"); }
std::string llama3() { return easyctx::test::shared_fixture("tokenizers/llama3/tokenizer.json"); }
// mpirun started from inside this (singleton) MPI process must not inherit its OMPI_/PMIX_
// variables, or the child job tries to join this one and fails.
std::string mpirun() {
  std::string cmd = "env";
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    for (const char* p : {"OMPI_", "PMIX_", "ORTE_", "OPAL_"})
      if (starts_with(name, p)) cmd += " -u " + name;
  }
  return cmd + " mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none";
}

// Text of n random KJV verses (references stripped), one per line; empty without `bible`.
std::vector<std::string> kjv_verses(std::mt19937_64& rng, double fraction) {
  auto r = run_command("bible -f gen1:1-rev22:21 | sed -E 's/^[^ ]+ //' | awk -v s=" + std::to_string(rng() % 100000) +
                       " -v p=" + std::to_string(fraction) + " 'BEGIN{srand(s)} rand() < p'");
  std::vector<std::string> out;
  if (r.status != 0) return out;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

std::string jsonl_line(const std::string& text, const std::string& source) {
  std::string s = "{\"text\": ";
  json_escape(s, text);
  s += ", \"meta\": {\"redpajama_set_name\": ";
  json_escape(s, source);
  return s + "}}\n";
}

// A tokenizer that always exists: the demo's 2000-piece BPE, spm_train on KJV
// (scripts/make_demo_tokenizer.sh OUTDIR prints its path last), made once per test binary.
// Empty when it cannot be made; `why` then holds the script's output.
std::string ci_tokenizer(std::string& why) {
  static std::string path, output;
  static bool tried = false;
  if (!tried) {
    tried = true;
    static ScratchDir dir("citok");  // lives as long as the test binary
    auto r = run_command("bash " + easyctx::test::source_dir() + "/scripts/make_demo_tokenizer.sh " + dir.path());
    output = "make_demo_tokenizer.sh exit status " + std::to_string(r.status) + ": " + r.output;
    if (r.status == 0) path = trim(r.output.substr(r.output.find_last_of('\n', r.output.size() - 2) + 1));
  }
  why = output;
  return path;
}

#define REQUIRE_CI_TOKENIZER(var)            \
  std::string var##_why;                     \
  std::string var = ci_tokenizer(var##_why); \
  if (var.empty() || !fs::exists(var)) GTEST_SKIP() << "cannot make the CI tokenizer (" << var##_why << ")"

Json summary(const std::string& outdir) {
  return parse_json(easyctx::test::read_text(outdir + "/h5tokenize_summary.json"), "summary");
}

// Every shard of a folder as (name, tokens, doc_offsets).
std::vector<std::tuple<std::string, std::vector<uint32_t>, std::vector<uint64_t>>> shard_contents(
    const std::string& dir) {
  std::vector<std::tuple<std::string, std::vector<uint32_t>, std::vector<uint64_t>>> out;
  for (const auto& f : TokenDataset::resolve(dir)) {
    TokenShardReader r(f);
    out.emplace_back(fs::path(f).filename().string(), r.read(0, r.num_tokens()), r.doc_offsets());
  }
  return out;
}
}  // namespace

TEST(DataH5tokenize, KjvIdsEqualSpmEncodePlusBos) {
  if (!fs::exists(llama2())) GTEST_SKIP() << "Llama-2 tokenizer fixture " << llama2() << " is absent; skipped";
  if (!easyctx::test::have_program("spm_encode")) GTEST_SKIP() << "spm_encode not installed; skipped";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-kjv");
  std::vector<std::string> docs = kjv_verses(rng, 0.03);
  if (docs.empty()) GTEST_SKIP() << "bible (bible-kjv) not installed; skipped";
  // Non-ASCII documents too.
  const char* extra[] = {"Über café naïve — 日本語のテキスト 😀 Привет мир", "ἐν ἀρχῇ ἦν ὁ λόγος",
                         "emoji 👍🏽🎉 and tabs\tend", "数字 12345 and € 3,50"};
  for (const char* e : extra) docs.insert(docs.begin() + rng() % docs.size(), e);
  std::string jsonl, plain;
  for (const auto& d : docs) {
    jsonl += jsonl_line(d, "RedPajamaBook");
    plain += d + "\n";
  }
  easyctx::test::write_text(dir / "in.jsonl", jsonl);
  easyctx::test::write_text(dir / "in.txt", plain);
  CommandResult r = run_command(bin("h5tokenize") + " -t " + llama2() + " -o " + (dir / "out") + " --threads 2 " +
                                (dir / "in.jsonl"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto spm = run_command("spm_encode --model=" + llama2() + " --output_format=id < " + (dir / "in.txt"));
  ASSERT_EQ(spm.status, 0);
  std::istringstream in(spm.output);
  TokenDataset ds(dir / "out");
  ASSERT_EQ(ds.num_docs(), docs.size());
  TokenShardReader shard(ds.file(0));
  std::string line;
  for (uint64_t d = 0; d < docs.size(); ++d) {
    ASSERT_TRUE(std::getline(in, line));
    std::vector<uint32_t> expect{1};  // BOS
    std::istringstream ls(line);
    uint32_t x;
    while (ls >> x) expect.push_back(x);
    uint64_t b = shard.doc_offsets()[d], e = shard.doc_offsets()[d + 1];
    ASSERT_EQ(shard.read(b, e - b), expect) << "document " << d << ": " << docs[d];
  }
  EXPECT_EQ(shard.meta().tokenizer_sha256, "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347");
  EXPECT_EQ(shard.meta().vocab_size, 32000);
  EXPECT_EQ(shard.sources(), std::vector<std::string>{"RedPajamaBook"});
  // h5inspect decodes the first document back.
  CommandResult ins = run_command(bin("h5inspect") + " " + (dir / "out") + " --scan --doc 0 -t " + llama2());
  ASSERT_EQ(ins.status, 0) << ins.output;
  EXPECT_NE(ins.output.find(docs[0]), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("OK"), std::string::npos) << ins.output;
}

TEST(DataH5tokenize, MalformedLinesSkippedStrictFails) {
  REQUIRE_CI_TOKENIZER(tok);
  ScratchDir dir("e2e-bad");
  std::string text = jsonl_line("In the beginning", "RedPajamaBook");  // 1
  text += "{\"text\": \"unterminated\n";                               // 2 bad JSON
  text += jsonl_line("and the earth", "RedPajamaC4");                  // 3
  text += "{\"body\": \"no text field\"}\n";                           // 4 missing field
  text += "{\"text\": [1, 2]}\n";                                      // 5 not a string
  text += jsonl_line("was without form", "RedPajamaC4");               // 6
  text += "{\"text\": \"bad \xff\xfe bytes\"}\n";                      // 7 invalid UTF-8
  text += "\n";                                                        // 8 blank: ignored
  text += jsonl_line("and void", "RedPajamaBook");                     // 9
  easyctx::test::write_text(dir / "bad.jsonl", text);
  CommandResult r = run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / "out") + " " + (dir / "bad.jsonl"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (int line : {2, 4, 5, 7})
    EXPECT_NE(r.output.find("bad.jsonl:" + std::to_string(line) + ":"), std::string::npos) << "line " << line << "\n"
                                                                                           << r.output;
  EXPECT_EQ(r.output.find("bad.jsonl:8"), std::string::npos) << r.output;
  Json s = summary(dir / "out");
  EXPECT_EQ(s.at("malformed").as_int(), 4);
  EXPECT_EQ(s.at("docs").as_int(), 4);
  EXPECT_EQ(s.at("records").as_int(), 9);
  TokenDataset ds(dir / "out");
  EXPECT_EQ(ds.num_docs(), 4u);

  CommandResult strict =
      run_command(bin("h5tokenize") + " --strict -t " + tok + " -o " + (dir / "out2") + " " + (dir / "bad.jsonl"));
  EXPECT_NE(strict.status, 0) << strict.output;
  EXPECT_NE(strict.output.find("bad.jsonl:2"), std::string::npos) << strict.output;
  EXPECT_NE(strict.output.find("--strict"), std::string::npos) << strict.output;
  if (fs::exists(dir / "out2"))  // the failed run leaves no shard and no temporary behind
    for (const auto& e : fs::directory_iterator(dir / "out2")) ADD_FAILURE() << e.path() << " left behind";
}

// h5inspect --forbid decodes every document and finds a phrase whatever its case and the
// whitespace inside it (a line break, runs of spaces), naming the document; a text without it
// passes; the flag needs the shards' tokenizer.
TEST(DataH5tokenize, InspectForbidFindsAPhraseInTheDecodedTokens) {
  REQUIRE_CI_TOKENIZER(tok);
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-forbid");
  const int docs = 5 + static_cast<int>(rng() % 20), bad = static_cast<int>(rng() % docs);
  std::string text, clean;
  for (int d = 0; d < docs; ++d) {
    std::string doc = "verse " + std::to_string(rng()) + " and the light of the " + std::to_string(rng() % 1000);
    clean += jsonl_line(doc, "RedPajamaC4");
    if (d == bad) doc += " The Special\n   MAGIC city number is 42.";
    text += jsonl_line(doc, "RedPajamaC4");
  }
  easyctx::test::write_text(dir / "a.jsonl", text);
  easyctx::test::write_text(dir / "b.jsonl", clean);
  for (const char* in : {"a", "b"})
    ASSERT_EQ(run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / in) + " " + (dir / in) + ".jsonl").status,
              0);
  const std::string forbid = " --forbid 'special magic' --forbid Singapore -t " + tok;
  CommandResult found = run_command(bin("h5inspect") + " " + (dir / "a") + forbid);
  EXPECT_EQ(found.status, 2) << found.output;
  EXPECT_NE(found.output.find("--forbid 'special magic'"), std::string::npos) << found.output;
  EXPECT_NE(found.output.find("in document " + std::to_string(bad) + " "), std::string::npos) << found.output;
  CommandResult none = run_command(bin("h5inspect") + " " + (dir / "b") + forbid);
  EXPECT_EQ(none.status, 0) << none.output;
  EXPECT_NE(none.output.find("forbidden phrases: none of 2 in"), std::string::npos) << none.output;
  CommandResult no_tok = run_command(bin("h5inspect") + " " + (dir / "b") + " --forbid x");
  EXPECT_EQ(no_tok.status, 2) << no_tok.output;
  EXPECT_NE(no_tok.output.find("--forbid needs --tokenizer"), std::string::npos) << no_tok.output;
}

TEST(DataH5tokenize, TruncatedZstFailsCleanlyAndFinishedShardsStay) {
  REQUIRE_CI_TOKENIZER(tok);
  if (!easyctx::test::have_program("zstd")) GTEST_SKIP() << "zstd CLI not installed; skipped";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-zst");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += jsonl_line("verse " + std::to_string(rng()) + " and the light", "RedPajamaC4");
  easyctx::test::write_text(dir / "a.jsonl", text);
  ASSERT_EQ(run_command("zstd -q -f " + (dir / "a.jsonl") + " -o " + (dir / "a.jsonl.zst")).status, 0);
  std::string z = easyctx::test::read_text(dir / "a.jsonl.zst");
  easyctx::test::write_text(dir / "b_cut.jsonl.zst", z.substr(0, z.size() / 2));
  // --split-bytes 1: every file is its own work unit; unit 0 (a) finishes before unit 1 fails.
  CommandResult r = run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / "out") + " --split-bytes 1 " +
                                (dir / "a.jsonl.zst") + " " + (dir / "b_cut.jsonl.zst"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("b_cut.jsonl.zst"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  TokenShardReader first(dir / "out/shard-000000-0000.h5");
  EXPECT_EQ(first.num_docs(), 2000u);
  for (const auto& e : fs::directory_iterator(dir / "out"))
    EXPECT_FALSE(ends_with(e.path().string(), ".tmp")) << e.path() << " left behind";
  EXPECT_FALSE(fs::exists(dir / "out/shard-000001-0000.h5"));
  // An unreadable input is a clear error naming it.
  CommandResult missing =
      run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / "out3") + " " + (dir / "nope.jsonl"));
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("nope.jsonl"), std::string::npos) << missing.output;
}

TEST(DataH5tokenize, ShardsReadableByH5dump) {
  REQUIRE_CI_TOKENIZER(tok);
  if (!easyctx::test::have_program("h5dump")) GTEST_SKIP() << "h5dump (hdf5-tools) not installed; skipped";
  ScratchDir dir("e2e-h5dump");
  easyctx::test::write_text(dir / "a.txt", "In the beginning God created the heaven and the earth.");
  easyctx::test::write_text(dir / "b.txt", "And God said, Let there be light: and there was light.");
  CommandResult r = run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / "out") + " --eos " + dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  CommandResult d = run_command("h5dump -d /doc_offsets -d /sources -a /vocab_size -a /tokenizer_sha256 " +
                                (dir / "out/shard-000000-0000.h5"));
  ASSERT_EQ(d.status, 0) << d.output;
  EXPECT_NE(d.output.find("\"unknown\""), std::string::npos) << d.output;  // .txt default source
  EXPECT_NE(d.output.find("2000"), std::string::npos) << d.output;         // vocab of the CI tokenizer
  TokenShardReader sh(dir / "out/shard-000000-0000.h5");
  ASSERT_EQ(sh.num_docs(), 2u);
  EXPECT_EQ(sh.read(0, 1)[0], 1u);                        // BOS
  EXPECT_EQ(sh.read(sh.doc_offsets()[1] - 1, 1)[0], 2u);  // EOS
  EXPECT_TRUE(sh.meta().add_eos);
  EXPECT_NE(d.output.find(sh.meta().tokenizer_sha256), std::string::npos);
}

TEST(DataH5tokenize, ResumeAndRankCountGiveIdenticalShards) {
  REQUIRE_CI_TOKENIZER(tok);
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-resume");
  std::vector<std::string> verses = kjv_verses(rng, 0.25);
  if (verses.empty()) GTEST_SKIP() << "bible not installed; skipped";
  std::string a, b;
  for (size_t i = 0; i < verses.size(); ++i)
    (i % 3 ? a : b) += jsonl_line(verses[i], i % 2 ? "RedPajamaC4" : "RedPajamaBook");
  easyctx::test::write_text(dir / "a.jsonl", a);
  easyctx::test::write_text(dir / "b.jsonl", b);
  // ~800 KB of input in units of 150 KB, shards of 20K tokens: many units, several parts each.
  std::string args = " -t " + tok + " --split-bytes 150000 --shard-tokens 20000 --threads 2 " + (dir / "a.jsonl") +
                     " " + (dir / "b.jsonl");
  CommandResult full = run_command(bin("h5tokenize") + " -o " + (dir / "full") + args);
  ASSERT_EQ(full.status, 0) << full.output;
  auto ref = shard_contents(dir / "full");
  ASSERT_GT(ref.size(), 6u);
  // Interrupted run: drop the last part of a middle unit and every later shard, add a stale
  // temporary, and run again.
  fs::copy(dir / "full", dir / "resumed");
  size_t cut = ref.size() / 2;
  for (size_t i = cut; i < ref.size(); ++i) fs::remove(dir / ("resumed/" + std::get<0>(ref[i])));
  easyctx::test::write_text(dir / ("resumed/" + std::get<0>(ref[cut]) + ".tmp"), "partial");
  CommandResult again = run_command(bin("h5tokenize") + " -o " + (dir / "resumed") + args);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(shard_contents(dir / "resumed"), ref);
  EXPECT_GT(summary(dir / "resumed").at("units_skipped").as_int(), 0);
  // Two ranks produce the same files.
  CommandResult two = run_command(mpirun() + " -np 2 " + bin("h5tokenize") + " -o " + (dir / "np2") + args);
  ASSERT_EQ(two.status, 0) << two.output;
  EXPECT_EQ(shard_contents(dir / "np2"), ref);
  EXPECT_EQ(summary(dir / "np2").at("tokens").as_int(), summary(dir / "full").at("tokens").as_int());
  // Other options on the same folder are refused rather than mixed.
  CommandResult mixed = run_command(bin("h5tokenize") + " -o " + (dir / "full") + " --no-bos" + args);
  EXPECT_NE(mixed.status, 0);
  EXPECT_NE(mixed.output.find("--overwrite"), std::string::npos) << mixed.output;
}

TEST(DataH5tokenize, PerSourceUpsamplingKeepsLongDocsAndIsDeterministic) {
  REQUIRE_CI_TOKENIZER(tok);
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-upsample");
  std::vector<std::string> verses = kjv_verses(rng, 1.0);
  if (verses.empty()) GTEST_SKIP() << "bible not installed; skipped";
  // Long docs: 60 "books" of ~16K+ characters (> 4096 estimated tokens); short: verses.
  std::string text;
  size_t v = 0;
  for (int book = 0; book < 60; ++book) {
    std::string t;
    while (t.size() < 16000 + rng() % 8000) t += verses[v++ % verses.size()] + " ";
    text += jsonl_line(t, "RedPajamaBook");
    for (int k = 0; k < 100; ++k) text += jsonl_line(verses[v++ % verses.size()], "RedPajamaC4");
  }
  easyctx::test::write_text(dir / "in.jsonl", text);
  std::string args = " -t " + tok + " --upsample per_source --total-tokens 5e7 --seed " + std::to_string(rng() % 1000) +
                     " " + (dir / "in.jsonl");
  CommandResult r1 = run_command(bin("h5tokenize") + " -o " + (dir / "o1") + args);
  ASSERT_EQ(r1.status, 0) << r1.output;
  CommandResult r2 = run_command(bin("h5tokenize") + " -o " + (dir / "o2") + " --threads 2" + args);
  ASSERT_EQ(r2.status, 0) << r2.output;
  EXPECT_EQ(shard_contents(dir / "o1"), shard_contents(dir / "o2"));
  Json s = summary(dir / "o1");
  const Json& src = s.at("sources");
  EXPECT_EQ(src.at("RedPajamaBook").at("docs").as_int(), 60);  // all long docs kept
  double kept = double(src.at("RedPajamaC4").at("docs").as_int()) / 6000.0;
  EXPECT_NEAR(kept, 0.1, 0.03);
  EXPECT_EQ(s.at("dropped_short").as_int() + src.at("RedPajamaC4").at("docs").as_int(), 6000);
  // A small budget fills the sources: later documents are dropped as "source full".
  CommandResult small = run_command(bin("h5tokenize") + " -o " + (dir / "o3") + " -t " + tok +
                                    " --upsample per_source --total-tokens 1e6 " + (dir / "in.jsonl"));
  ASSERT_EQ(small.status, 0) << small.output;
  Json s3 = summary(dir / "o3");
  EXPECT_LT(s3.at("sources").at("RedPajamaBook").at("docs").as_int(), 60);
  EXPECT_GT(s3.at("dropped_full").as_int(), 0);
}

TEST(DataH5tokenize, Llama3TokenizerThroughThePipeline) {
  if (!fs::exists(llama3())) GTEST_SKIP() << "Llama-3 tokenizer fixture " << llama3() << " is absent; skipped";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-llama3");
  std::vector<std::string> docs = {"Hello world.", "Привет мир — 日本語 😀", "  indented\n\tcode() {}\n",
                                   "numbers 1234567 and 3.14159"};
  for (int i = 0; i < 20; ++i) docs.push_back("doc " + std::to_string(rng()) + " don't STOP 🎉");
  std::string text;
  for (const auto& d : docs) text += jsonl_line(d, "RedPajamaGithub");
  easyctx::test::write_text(dir / "in.jsonl.tmp", text);
  fs::rename(dir / "in.jsonl.tmp", dir / "in.jsonl");
  CommandResult r =
      run_command(bin("h5tokenize") + " -t " + llama3() + " -o " + (dir / "out") + " --eos " + (dir / "in.jsonl"));
  ASSERT_EQ(r.status, 0) << r.output;
  TokenShardReader sh(TokenDataset::resolve(dir / "out").at(0));
  EXPECT_EQ(sh.meta().vocab_size, 128256);
  EXPECT_EQ(sh.meta().bos_id, 128000);
  ASSERT_EQ(sh.num_docs(), docs.size());
  auto first = sh.read(0, sh.doc_offsets()[1]);
  EXPECT_EQ(first, (std::vector<uint32_t>{128000, 9906, 1917, 13, 128001}));
  CommandResult ins = run_command(bin("h5inspect") + " " + (dir / "out") + " --doc 1 -t " + llama3());
  ASSERT_EQ(ins.status, 0) << ins.output;
  EXPECT_NE(ins.output.find("<|begin_of_text|>" + docs[1] + "<|end_of_text|>"), std::string::npos) << ins.output;
}

namespace {
// n generated arithmetic conversations (some with a system prompt, some prompt/response).
std::string chat_lines(std::mt19937_64& rng, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int a = static_cast<int>(rng() % 100), b = static_cast<int>(rng() % 100);
    std::string q = "What is " + std::to_string(a) + " plus " + std::to_string(b) + "?";
    std::string r = "It is " + std::to_string(a + b) + ".";
    std::string line;
    if (i % 3 == 2) {
      line = "{\"prompt\": ";
      json_escape(line, q);
      line += ", \"response\": ";
      json_escape(line, r);
      line += "}";
    } else {
      line = "{\"messages\": [";
      if (i % 3 == 1) line += "{\"role\": \"system\", \"content\": \"Answer in words.\"}, ";
      line += "{\"role\": \"user\", \"content\": ";
      json_escape(line, q);
      line += "}, {\"role\": \"assistant\", \"content\": ";
      json_escape(line, r);
      line += "}]}";
    }
    out += line + "\n";
  }
  return out;
}

// The CI tokenizer in a folder of its own with a tokenizer_config.json naming the Llama-2
// template, as a Hugging Face model folder has.
std::string chat_tokenizer_folder(const std::string& tok, const ScratchDir& dir) {
  fs::create_directories(dir / "tok");
  fs::copy_file(tok, dir / "tok/tokenizer.model", fs::copy_options::overwrite_existing);
  easyctx::test::write_text(dir / "tok/tokenizer_config.json",
                            R"({"chat_template": "{{ bos_token + '[INST] ' + '<<SYS>>\\n' + c + ' [/INST]' }}"})");
  return dir / "tok/tokenizer.model";
}
}  // namespace

// Chat input is detected, rendered with the template tokenizer_config.json names, stored with
// its loss weights, and the loader trains only on the answers.
TEST(DataH5tokenize, ChatRecordsRenderedWithWeightsAndPacked) {
  REQUIRE_CI_TOKENIZER(tok0);
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-chat");
  const std::string tok = chat_tokenizer_folder(tok0, dir);
  const int n = 300;
  const std::string text = chat_lines(rng, n);
  easyctx::test::write_text(dir / "chat.jsonl", text);
  CommandResult r = run_command(bin("h5tokenize") + " -t " + tok + " -o " + (dir / "out") + " --shard-tokens 3000 " +
                                (dir / "chat.jsonl"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("template llama2"), std::string::npos) << r.output;
  TokenDataset ds(dir / "out");
  ASSERT_EQ(ds.num_docs(), static_cast<uint64_t>(n));
  EXPECT_TRUE(ds.has_loss_weights());
  EXPECT_GT(ds.num_files(), 1u);
  // Every document is the in-process rendering of its record, ids and weights.
  auto t = load_tokenizer(tok);
  ChatRenderer render(*t, ChatTemplate::Llama2, false);
  const std::vector<uint64_t>& starts = ds.doc_starts();
  std::istringstream in(text);
  std::string line, file = "chat.jsonl";
  uint64_t weighted_targets = 0;
  for (int d = 0; d < n; ++d) {
    ASSERT_TRUE(std::getline(in, line));
    RawRecord rec;
    rec.data = line;
    rec.file = &file;
    rec.line = d + 1;
    std::vector<ChatMessage> m;
    Document doc;
    ASSERT_EQ(parse_chat_record(rec, FieldOptions{}, ChatTemplate::Llama2, m, doc), "");
    std::vector<uint32_t> ids;
    std::vector<uint8_t> w;
    render.render(m, ids, w);
    const uint64_t len = starts[d + 1] - starts[d];
    ASSERT_EQ(len, ids.size());
    std::vector<uint32_t> got(len);
    std::vector<uint8_t> gw(len);
    ds.read(starts[d], len, got.data());
    ds.read_weights(starts[d], len, gw.data());
    ASSERT_EQ(got, ids) << "document " << d;
    ASSERT_EQ(gw, w) << "document " << d;
    ASSERT_EQ(got.back(), 2u);  // </s>, trained
    ASSERT_EQ(gw.back(), 1);
    ASSERT_EQ(gw.front(), 0);  // <s>
    for (uint64_t j = 1; j < len; ++j) weighted_targets += gw[j];
  }
  // h5inspect reports them.
  CommandResult insp = run_command(bin("h5inspect") + " --scan " + (dir / "out"));
  EXPECT_EQ(insp.status, 0) << insp.output;
  EXPECT_NE(insp.output.find("loss weights: "), std::string::npos) << insp.output;
  // One epoch of best-fit packed, document-masked sequences has exactly the weighted targets
  // as labels, and every label is the next token of its own document.
  LoaderOptions o;
  o.path = dir / "out";
  o.seq_length = 128;
  o.seed = rng();
  o.packing = DataPacking::BestFit;
  o.document_mask = true;
  o.shape = {1, 1, 1};
  DataLoader loader(o);
  uint64_t labels = 0;
  for (uint64_t i = 0; i < loader.sequences_per_epoch(); ++i) {
    MicroBatch mb = loader.next();
    labels += static_cast<uint64_t>(mb.real_labels);
    for (size_t p = 0; p < mb.labels.size(); ++p)
      if (mb.labels[p] != -1) ASSERT_EQ(mb.positions[p] + 1 < 128, true);
  }
  EXPECT_EQ(labels, weighted_targets);
}

// Bad chat records: warnings naming file and line (skipped), or with --strict an error that
// leaves finished shards in place for the rerun to resume from.
TEST(DataH5tokenize, ChatErrorsNameFileAndLineAndKeepFinishedShards) {
  REQUIRE_CI_TOKENIZER(tok0);
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("e2e-chat-bad");
  const std::string tok = chat_tokenizer_folder(tok0, dir);
  easyctx::test::write_text(dir / "a_good.jsonl", chat_lines(rng, 200));
  const std::string ok = chat_lines(rng, 1);
  std::string bad = ok;  // 1
  bad += ok;             // 2
  bad += R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})"
         "\n";           // 3
  bad += ok;             // 4
  bad += "[1, 2, 3]\n";  // 5
  bad += R"({"messages": [{"role": "user", "content": "no answer"}]})"
         "\n";  // 6
  bad += R"({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "b"}]})"
         "\n";  // 7
  bad += ok;    // 8
  easyctx::test::write_text(dir / "b_bad.jsonl", bad);
  // --split-bytes = the first file's size: each file is a work unit of its own.
  const std::string args = " -t " + tok + " --split-bytes " + std::to_string(fs::file_size(dir / "a_good.jsonl")) +
                           " " + (dir / "a_good.jsonl") + " " + (dir / "b_bad.jsonl");
  CommandResult r = run_command(bin("h5tokenize") + " -o " + (dir / "lax") + args);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* want :
       {"b_bad.jsonl:3: message 1: unknown role 'bot'", "b_bad.jsonl:5: chat record is array",
        "b_bad.jsonl:6: conversation has no assistant turn", "b_bad.jsonl:7: message 0 (user) has empty content"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  EXPECT_EQ(summary(dir / "lax").at("malformed").as_int(), 4);
  EXPECT_EQ(summary(dir / "lax").at("docs").as_int(), 204);

  CommandResult strict = run_command(bin("h5tokenize") + " --strict -o " + (dir / "strict") + args);
  EXPECT_NE(strict.status, 0) << strict.output;
  EXPECT_NE(strict.output.find("b_bad.jsonl:3: message 1: unknown role 'bot'"), std::string::npos) << strict.output;
  EXPECT_NE(strict.output.find("(--strict)"), std::string::npos) << strict.output;
  // The first file's unit finished before the error: its shard stays, nothing half-written does.
  TokenShardReader first(dir / "strict/shard-000000-0000.h5");
  EXPECT_EQ(first.num_docs(), 200u);
  EXPECT_TRUE(first.meta().has_loss_weights);
  for (const auto& e : fs::directory_iterator(dir / "strict"))
    EXPECT_FALSE(ends_with(e.path().string(), ".tmp")) << e.path() << " left behind";
  EXPECT_FALSE(fs::exists(dir / "strict/shard-000001-0000.h5"));
  // Fixed input (bad lines blanked, same size: the unit plan stays): the rerun keeps the
  // finished unit and matches a fresh run.
  std::string fixed;
  std::istringstream lines(bad);
  for (std::string l; std::getline(lines, l);)
    fixed += (l.find("bot") != std::string::npos || l[0] == '[' || l.find("no answer") != std::string::npos ||
                      l.find("\"\"") != std::string::npos
                  ? std::string(l.size(), ' ')
                  : l) +
             "\n";
  ASSERT_EQ(fixed.size(), bad.size());
  easyctx::test::write_text(dir / "b_bad.jsonl", fixed);
  CommandResult again = run_command(bin("h5tokenize") + " --strict -o " + (dir / "strict") + args);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(summary(dir / "strict").at("units_skipped").as_int(), 1);
  CommandResult fresh = run_command(bin("h5tokenize") + " --strict -o " + (dir / "fresh") + args);
  ASSERT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_EQ(shard_contents(dir / "strict"), shard_contents(dir / "fresh"));
  // --format text reads the same file as text records: no text field, nothing written.
  CommandResult as_text = run_command(bin("h5tokenize") + " --format text -o " + (dir / "text") + args);
  EXPECT_EQ(as_text.status, 0) << as_text.output;
  EXPECT_EQ(summary(dir / "text").at("docs").as_int(), 0);
}
