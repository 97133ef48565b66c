// Bounded memory per document in h5tokenize: the tokenizer sees pieces of a long document and
// gives exactly the ids of the whole text, and a record above --max-doc-bytes is refused
// naming the file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/tokenize/corpus.h"
#include "data/tokenize/h5tokenize_run.h"
#include "data/tokenize/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

using easyctx::test::input_error_of;

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Text with every feature the cut rule must respect: words, runs of spaces, tabs, newlines,
// digits, contractions, punctuation, multi-byte UTF-8 and special-token text.
std::string random_text(std::mt19937_64& rng, size_t bytes) {
  static const std::vector<std::string> parts = {"the",
                                                 "The",
                                                 "and",
                                                 "of",
                                                 "to",
                                                 "in",
                                                 "that",
                                                 "is",
                                                 "it's",
                                                 "don't",
                                                 "I'm",
                                                 "hello",
                                                 "world",
                                                 "a",
                                                 "b",
                                                 "x9",
                                                 "2024",
                                                 "1",
                                                 "42",
                                                 "3.14",
                                                 "e.g.",
                                                 ",",
                                                 ".",
                                                 "!",
                                                 "?",
                                                 "(",
                                                 ")",
                                                 "\"",
                                                 "'",
                                                 "-",
                                                 "--",
                                                 "\n",
                                                 "\n\n",
                                                 "\t",
                                                 "  ",
                                                 "   ",
                                                 " ",
                                                 "é",
                                                 "über",
                                                 "naïve",
                                                 "中文",
                                                 "日本語",
                                                 "🙂",
                                                 "Привет",
                                                 "λ",
                                                 "<s>",
                                                 "</s>",
                                                 "<|begin_of_text|>",
                                                 "<|end_of_text|>",
                                                 "www.example.com",
                                                 "foo_bar",
                                                 "CamelCase",
                                                 "ALLCAPS"};
  std::string s;
  while (s.size() < bytes) {
    s += parts[rng() % parts.size()];
    if (rng() % 3) s += ' ';
  }
  return s;
}

std::string llama_regex_bpe_json() {
  return easyctx::test::byte_level_bpe_json(
      {"Ġ t",   "t h", "Ġt h",    "h e", "Ġth e", "Ġ a",   "a n",    "Ġa n", "Ġan d", "Ġ w",  "o r",
       "Ġw or", "l d", "Ġwor ld", "e l", "l o",   "el lo", "h ello", "1 2",  "Ġ Ġ",   "ĠĠ Ġ", "Ċ Ċ"},
      true,
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "<|end_of_text|>");
}

// Every tokenizer this machine has: a byte-level BPE written here (always), the demo's
// SentencePiece (spm_train on KJV, as scripts/make_demo_tokenizer.sh makes it) and the
// Llama 2 / Llama 3 fixtures when present.
std::vector<std::pair<std::string, std::string>> tokenizers(const ScratchDir& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  easyctx::test::write_text(dir / "tokenizer.json", llama_regex_bpe_json());
  out.push_back({"bpe (Llama 3 regex)", dir / "tokenizer.json"});
  const auto r = easyctx::test::run_command(easyctx::test::source_dir() + "/scripts/make_demo_tokenizer.sh " +
                                            dir.path() + "/demo 2>/dev/null");
  if (r.status == 0 && fs::exists(dir / "demo/kjv_bpe2000.model"))
    out.push_back({"demo spm", dir / "demo/kjv_bpe2000.model"});
  for (const char* f : {"tokenizers/llama2/tokenizer.model", "tokenizers/llama3/tokenizer.json"})
    if (fs::exists(easyctx::test::shared_fixture(f))) out.push_back({f, easyctx::test::shared_fixture(f)});
  return out;
}

}  // namespace

// encode_pieces gives exactly encode's ids on fresh random texts for random piece sizes
// (down to a few bytes, so nearly every cut point is used), for every tokenizer at hand,
// whenever it reports no forced cut; with pieces of 8 bytes or more it never has to force one
// in these texts.
TEST(DataStrict, PiecewiseTokenizationEqualsWholeText) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("pieces");
  int checked = 0;
  for (const auto& [name, path] : tokenizers(dir)) {
    const auto tok = load_tokenizer(path);
    EXPECT_NE(tok->cut(), Tokenizer::Cut::None) << name;
    if (ends_with(path, ".model")) EXPECT_EQ(tok->cut(), Tokenizer::Cut::DropSpace) << name;
    else EXPECT_EQ(tok->cut(), Tokenizer::Cut::KeepSpace) << name;
    int exact = 0;
    for (int trial = 0; trial < 40; ++trial) {
      const std::string text = random_text(rng, 200 + rng() % 4000);
      const std::vector<uint32_t> whole = tok->encode(text);
      const size_t piece = 8 + rng() % 64;
      std::vector<uint32_t> pieces;
      std::vector<Tokenizer::Piece> cuts;
      const size_t forced = tok->encode_pieces(text, pieces, piece, &cuts);
      if (!tok->memory_per_word())
        for (const auto& c : cuts) ASSERT_LE(c.end - c.begin - c.skip, 4 * piece) << name;
      if (forced) continue;
      ASSERT_EQ(pieces, whole) << name << ", piece " << piece << ", text:\n" << text;
      ++exact;
    }
    std::printf("%s: cuts at spaces between %s characters%s; %d of 40 texts without a forced cut\n", name.c_str(),
                tok->cuts_between_any_characters() ? "any" : "ASCII alphanumeric",
                tok->cuts_after_line_breaks() ? " and after line breaks" : "", exact);
    // Llama 2 and every byte-level BPE here pass the wide probes; a byte-level BPE is never
    // forced (its memory is bounded per pre-token), SentencePiece rarely with such small pieces.
    if (name != "demo spm") EXPECT_TRUE(tok->cuts_between_any_characters() && tok->cuts_after_line_breaks()) << name;
    if (tok->memory_per_word()) EXPECT_EQ(exact, 40) << name;
    EXPECT_GE(exact, 30) << name;
    checked += exact;
  }
  EXPECT_GE(checked, 40);
}

// Text without a space: lines of unspaced CJK are cut after their line breaks (exact where
// the tokenizer passes the probe: Llama 2's SentencePiece, every byte-level BPE); text with
// neither is cut by force, SentencePiece's pieces never longer than 4 x piece_bytes, and the
// ids still decode to the text (no dummy-prefix space at a cut). A byte-level BPE cuts only a
// pre-token longer than kMaxWordBytes.
TEST(DataStrict, TextWithoutSpacesIsCutBoundedAndDecodesBack) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("nospace");
  static const char* const cjk[] = {"日本語", "中文", "東京", "の", "は", "。", "、", "テキスト"};
  int exact = 0;
  for (const auto& [name, path] : tokenizers(dir)) {
    const auto tok = load_tokenizer(path);
    std::string lines;
    while (lines.size() < 20000) {
      for (int k = 0; k < 5 + static_cast<int>(rng() % 30); ++k) lines += cjk[rng() % std::size(cjk)];
      lines += "\n";
    }
    std::vector<uint32_t> ids;
    const size_t forced = tok->encode_pieces(lines, ids, 64);
    if (forced == 0) {
      EXPECT_EQ(ids, tok->encode(lines)) << name;
      ++exact;
    }
    if (path.find("llama2") != std::string::npos || ends_with(path, ".json")) EXPECT_EQ(forced, 0u) << name;
    std::string letters;
    for (int i = 0; i < 50000; ++i) letters += static_cast<char>('a' + rng() % 26);
    ids.clear();
    std::vector<Tokenizer::Piece> cuts;
    const size_t f = tok->encode_pieces(letters, ids, 1024, &cuts);
    EXPECT_EQ(tok->decode(ids), letters) << name;
    if (tok->memory_per_word()) {
      EXPECT_EQ(f, 0u) << name;
      EXPECT_EQ(ids, tok->encode(letters)) << name;
    } else {
      EXPECT_GT(f, 0u) << name;
      for (const auto& c : cuts) EXPECT_LE(c.end - c.begin - c.skip, 4 * 1024u) << name;
    }
  }
  EXPECT_GE(exact, 1);
  // A byte-level BPE pre-token beyond kMaxWordBytes is cut (counted) and decodes back.
  easyctx::test::write_text(dir / "bpe.json", llama_regex_bpe_json());
  const auto bpe = load_tokenizer(dir / "bpe.json");
  std::string word(Tokenizer::kMaxWordBytes + 1000 + rng() % 1000, 'a');
  for (auto& c : word) c = static_cast<char>('a' + rng() % 26);
  std::vector<uint32_t> ids;
  EXPECT_EQ(bpe->encode_pieces(word, ids, 4096), 1u);
  EXPECT_EQ(bpe->decode(ids), word);
}

// A byte-order mark at the start of a file, of a line (files joined by cat) or of a .txt file
// is removed and flagged; --format auto decides by a sample, not by a cut-off first line.
TEST(DataStrict, ByteOrderMarksAndFormatDetection) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("bom");
  const std::string bom = "\xEF\xBB\xBF";
  std::string chat;
  const int n = 20 + static_cast<int>(rng() % 40);
  for (int i = 0; i < n; ++i)
    chat += (i == 7 ? bom : "") + std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"q") +
            std::to_string(rng() % 1000) + "\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n";
  easyctx::test::write_text(dir / "c.jsonl", bom + "{\"messages\": [{\"role\": \"us\n" + chat);
  easyctx::test::write_text(dir / "t.txt", bom + "text");
  const auto units = plan_units({dir / "c.jsonl", dir / "t.txt"}, 1 << 30);
  UnitReader rd(units[0]);
  RawRecord r;
  std::vector<uint64_t> boms;
  std::string txt;
  while (rd.next(r)) {
    if (r.bom) boms.push_back(r.line);
    EXPECT_FALSE(starts_with(r.data, bom)) << r.line;
    if (r.is_text_file) txt = std::string(r.data);
  }
  EXPECT_EQ(boms, (std::vector<uint64_t>{1, 9, 1}));
  EXPECT_EQ(txt, "text");
  std::string why;
  EXPECT_EQ(detect_format(plan_units({dir / "c.jsonl"}, 1 << 30), FieldOptions(), 1 << 30, why), "chat") << why;
  EXPECT_NE(why.find(std::to_string(std::min(n, kFormatSampleRecords - 1)) + " chat"), std::string::npos) << why;
  EXPECT_NE(why.find("1 neither (first " + dir / "c.jsonl:1)"), std::string::npos) << why;
}

// The counts survive their JSON form (the resume cursors, the ranks' exchange), the files
// with skips are capped, the earliest kept, and the threshold error names file, count and
// the first skipped line.
TEST(DataStrict, SkipCountsRoundTripAndThreshold) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  TokenizeStats a;
  a.records = 1000 + rng() % 1000;
  const uint64_t files = TokenizeStats::kMaxSkipFiles + 5;
  uint64_t skipped = 0;
  for (uint64_t f = 0; f < files; ++f)
    for (uint64_t k = 0; k < 1 + f % 3; ++k, ++skipped)
      a.skip("f" + std::to_string(files - f) + ".jsonl", files - f, 10 + k, "bad JSON");
  a.blank = rng() % 10;
  a.boms = 1;
  TokenizeStats b;
  b.merge_json(a.to_json());
  EXPECT_EQ(b.to_json(), a.to_json());
  EXPECT_EQ(b.malformed, skipped);
  EXPECT_EQ(b.skipped_files.size(), TokenizeStats::kMaxSkipFiles);
  EXPECT_EQ(b.other_skip_files, 5u);
  EXPECT_TRUE(b.skipped_files.count("f1.jsonl"));
  EXPECT_EQ(b.skipped_error(1.0), "");
  const std::string e = b.skipped_error(0.001);
  EXPECT_NE(e.find(std::to_string(skipped) + " of " + std::to_string(a.records) + " records"), std::string::npos) << e;
  EXPECT_NE(e.find("f1.jsonl: 1 skipped, first f1.jsonl:10: bad JSON"), std::string::npos) << e;
  EXPECT_LT(e.find("f1.jsonl"), e.find("f2.jsonl")) << "in input order: " << e;
  EXPECT_NE(e.find("in 5 more file(s)"), std::string::npos) << e;
}

// A record longer than the limit is refused naming the file, the line and the limit, before
// the reader holds much more than the limit.
TEST(DataStrict, RecordsAboveTheLimitNameFileAndLine) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("maxdoc");
  const uint64_t limit = 1000 + rng() % 5000;
  std::string jsonl;
  const int long_line = 2 + static_cast<int>(rng() % 5);
  for (int i = 1; i <= long_line; ++i)
    jsonl += "{\"text\": \"" + std::string(i == long_line ? limit + 1 + rng() % 100000 : 10, 'a') + "\"}\n";
  easyctx::test::write_text(dir / "c.jsonl", jsonl);
  const auto units = plan_units({dir / "c.jsonl"}, 1 << 30);
  UnitReader rd(units[0], limit);
  RawRecord r;
  std::string e = input_error_of([&] {
    while (rd.next(r)) {}
  });
  EXPECT_NE(e.find(dir / "c.jsonl:" + std::to_string(long_line) + ": a line longer than --max-doc-bytes " +
                   std::to_string(limit)),
            std::string::npos)
      << e;
  easyctx::test::write_text(dir / "t.txt", std::string(limit + 1, 'b'));
  const auto tu = plan_units({dir / "t.txt"}, 1 << 30);
  UnitReader rt(tu[0], limit);
  e = input_error_of([&] { rt.next(r); });
  EXPECT_NE(e.find(dir / "t.txt:1: the file (one document, " + std::to_string(limit + 1) +
                   " bytes) is longer than --max-doc-bytes " + std::to_string(limit)),
            std::string::npos)
      << e;
  UnitReader ok(units[0], limit + 200000);
  int n = 0;
  while (ok.next(r)) ++n;
  EXPECT_EQ(n, long_line);
}
