// Needle and synthetic prompts checked token by token with real tokenizers: the CI one
// (spm_train on the KJV: scripts/make_demo_tokenizer.sh), the Llama-2 SentencePiece and the
// Llama-3 byte-level BPE fixtures (../shared/fixtures/tokenizers; skipped, saying so, where a
// clone lacks them). Independent of PromptBuilder's own rule, a sentence end is checked by
// decoding the token. Every prompt is the user's text only: no padding, no EOS (the session
// pads inside, where nothing reads it: tests/eval/test_eval_sp.cpp). The haystack readers
// (text, JSON Lines, shards, the KJV default) give the tokens of their files in order.
#include <algorithm>
#include <cctype>
#include <set>

#include "data/tokenize/tokenizer.h"
#include "eval/haystack.h"
#include "eval/retrieval.h"
#include "needle_test_util.h"

namespace easyctx::test {
namespace {

using eval::Prompt;
using eval::PromptBuilder;
using eval::Task;
using Ids = std::vector<uint32_t>;

// The token's text is one or more of . ! ? and whitespace (decoded, not PromptBuilder's).
bool decodes_to_sentence_end(const data::Tokenizer& tok, uint32_t id) {
  const std::string s = tok.decode(&id, 1);
  bool any = false;
  for (char c : s) {
    if (c == '.' || c == '!' || c == '?') any = true;
    else if (!std::isspace(static_cast<unsigned char>(c))) return false;
  }
  return any;
}

Ids slice(const Prompt& p, int64_t begin, int64_t end) {
  Ids v;
  for (int64_t i = begin; i < end; ++i) v.push_back(static_cast<uint32_t>(p.tokens[static_cast<size_t>(i)]));
  return v;
}

bool contains(const Ids& hay, const Ids& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

// What every prompt must be: BOS + prefix, the haystack's first L tokens with the inserts at
// their points and nothing else (no padding), the question, the answer; the span scores the
// answer's tokens.
void check_structure(const data::Tokenizer& tok, const PromptBuilder& b, const Prompt& p, const Ids& hay, int64_t L,
                     const std::string& prefix, const std::string& question) {
  ASSERT_GE(p.tokens.size(), 2u);
  EXPECT_EQ(p.tokens[0], tok.bos_id());
  EXPECT_EQ(slice(p, 1, p.context_begin), tok.encode(prefix));
  // The context minus the inserts is hay[0, L), each insert where its point says.
  Ids rest;
  int64_t at = p.context_begin;
  for (const eval::Insert& in : p.inserts) {
    ASSERT_GE(in.at, at);
    const Ids before = slice(p, at, in.at);
    rest.insert(rest.end(), before.begin(), before.end());
    EXPECT_EQ(static_cast<int64_t>(rest.size()), in.haystack_point) << in.text;
    EXPECT_EQ(slice(p, in.at, in.at + in.length), tok.encode(in.text)) << in.text;
    at = in.at + in.length;
  }
  const Ids tail = slice(p, at, p.context_end);
  rest.insert(rest.end(), tail.begin(), tail.end());
  ASSERT_EQ(static_cast<int64_t>(rest.size()), L);
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), hay.begin())) << "the context is not the haystack's first L tokens";
  // Every insert sits at the start, the end, or right after a sentence end.
  for (const eval::Insert& in : p.inserts) {
    if (in.haystack_point > 0 && in.haystack_point < L) {
      EXPECT_TRUE(decodes_to_sentence_end(tok, hay[static_cast<size_t>(in.haystack_point - 1)]))
          << in.text << " at " << in.haystack_point;
    }
  }
  // Question, then the answer, which ends the prompt.
  const bool digit = std::isdigit(static_cast<unsigned char>(p.answer[0])) != 0;
  const bool llama3 = tok.kind() == "hf-bpe";
  EXPECT_EQ(slice(p, p.context_end, p.answer_begin), tok.encode(llama3 && digit ? question + " " : question));
  EXPECT_EQ(slice(p, p.answer_begin, static_cast<int64_t>(p.tokens.size())),
            tok.encode(llama3 && !digit ? " " + p.answer : p.answer));
  EXPECT_EQ(p.answer_begin + p.answer_length, static_cast<int64_t>(p.tokens.size()));
  EXPECT_EQ(trim(tok.decode(slice(p, p.answer_begin, p.answer_begin + p.answer_length))), p.answer);
  // No padding, no EOS anywhere: the prompt is the user's text only.
  for (int32_t t : p.tokens) {
    EXPECT_NE(t, tok.eos_id());
    EXPECT_GE(t, 0);
    EXPECT_LT(t, tok.vocab_size());
  }
  // The one span: the predictions at answer_begin - 1 ... of the answer's tokens.
  const eval::ScoreRequest r = p.request();
  EXPECT_EQ(r.tokens, p.tokens);
  ASSERT_EQ(r.spans.size(), 1u);
  EXPECT_EQ(r.spans[0].begin, p.answer_begin - 1);
  EXPECT_EQ(r.spans[0].length, p.answer_length);
  EXPECT_EQ(r.spans[0].begin + r.spans[0].length, static_cast<int64_t>(r.tokens.size()) - 1);
  (void)b;
}

// The answer as the model would continue the question: the question's last token followed by
// the answer's tokens appears in the target insert (the Llama-3 spacing: without the trailing
// space the BPE question ends in ":" and the answer's digits follow " " in the needle).
void check_answer_continues_like_the_needle(const Prompt& p) {
  const Ids whole = slice(p, 0, static_cast<int64_t>(p.tokens.size()));
  Ids cont{whole[static_cast<size_t>(p.answer_begin - 1)]};
  for (int64_t i = p.answer_begin; i < p.answer_begin + p.answer_length; ++i)
    cont.push_back(whole[static_cast<size_t>(i)]);
  bool found = false;
  for (const eval::Insert& in : p.inserts)
    if (in.target) found |= contains(slice(p, in.at, in.at + in.length), cont);
  EXPECT_TRUE(found) << "the question's last token + the answer's tokens are not in the needle: " << p.answer;
}

struct Fixture {
  std::unique_ptr<data::Tokenizer> tok;
  Ids hay;
};

Fixture load(const std::string& path, int64_t min_tokens) {
  Fixture f;
  f.tok = data::load_tokenizer(path);
  TempDir dir("needle-hay");
  write_file_atomic(dir / "b.txt", haystack_text(7, 400));
  write_file_atomic(dir / "a.txt", haystack_text(3, 400));
  f.hay = eval::load_haystack(dir.path(), *f.tok, min_tokens).tokens;
  return f;
}

void needle_cases(const std::string& path) {
  const Fixture f = load(path, 4000);
  const data::Tokenizer& tok = *f.tok;
  eval::TaskOptions to;
  const PromptBuilder b(tok, to);
  EXPECT_EQ(b.llama3_spacing(), tok.kind() == "hf-bpe");
  const int64_t L = 1500;
  const std::string question = b.needle_question("Singapore");
  const std::string prefix = "This is a very long story book: <book>";
  EXPECT_EQ(PromptBuilder::needle_prefix(), prefix);
  EXPECT_EQ(
      question,
      "</book>.\n Based on the content of the book, Question: What is the special magic Singapore number? Answer: "
      "The special magic Singapore number is:");
  // Depth 0: the needle opens the context.
  {
    eval::Rng rng(1);
    const Prompt p = b.needle(f.hay, L, 0.0, 1234567, rng);
    check_structure(tok, b, p, f.hay, L, prefix, question);
    ASSERT_EQ(p.inserts.size(), 1u);
    EXPECT_EQ(p.inserts[0].haystack_point, 0);
    EXPECT_EQ(p.inserts[0].at, p.context_begin);
    EXPECT_EQ(p.inserts[0].text, "\nThe special magic Singapore number is: 1234567.\n");
    EXPECT_EQ(p.answer, "1234567");
    check_answer_continues_like_the_needle(p);
  }
  // Middle depths: right after the first sentence end at or after int(L * d).
  for (double d : {0.1, 0.3, 0.5, 0.7, 0.9, 0.37}) {
    eval::Rng rng(2);
    const Prompt p = b.needle(f.hay, L, d, 7654321, rng);
    check_structure(tok, b, p, f.hay, L, prefix, question);
    const int64_t from = static_cast<int64_t>(L * d);
    const int64_t point = p.inserts.at(0).haystack_point;
    ASSERT_GT(point, from) << "depth " << d;
    ASSERT_LE(point, L);
    EXPECT_TRUE(decodes_to_sentence_end(tok, f.hay[static_cast<size_t>(point - 1)])) << "depth " << d;
    for (int64_t i = from; i < point - 1; ++i)
      EXPECT_FALSE(decodes_to_sentence_end(tok, f.hay[static_cast<size_t>(i)])) << "an earlier sentence end at " << i;
    check_answer_continues_like_the_needle(p);
  }
  // Depth 1: no sentence end at or after L inside the cut haystack: the end.
  {
    eval::Rng rng(3);
    const Prompt p = b.needle(f.hay, L, 1.0, 1000000, rng);
    check_structure(tok, b, p, f.hay, L, prefix, question);
    EXPECT_EQ(p.inserts.at(0).haystack_point, L);
    EXPECT_EQ(p.inserts[0].at + p.inserts[0].length, p.context_end);
  }
  // No sentence end after the depth's point: the end too, never mid-sentence.
  {
    Ids hay = tok.encode("One. Two three four five six seven eight nine ten eleven twelve thirteen fourteen");
    const int64_t n = static_cast<int64_t>(hay.size());
    eval::Rng rng(4);
    const Prompt p = b.needle(hay, n, 0.5, 1234567, rng);
    check_structure(tok, b, p, hay, n, prefix, question);
    EXPECT_EQ(p.inserts.at(0).haystack_point, n);
    EXPECT_EQ(b.depth_point(hay, n, 0.01), b.after_sentence_end(hay, n, 0));
    EXPECT_LT(b.depth_point(hay, n, 0.01), n);
  }
  // Distractors: other cities, distinct numbers, each after a sentence end, never inside
  // another insert; the target is the only one asked.
  {
    eval::TaskOptions o2;
    o2.distractors = 9;
    const PromptBuilder bd(tok, o2);
    for (uint64_t seed = 0; seed < 5; ++seed) {
      eval::Rng rng(seed);
      const Prompt p = bd.needle(f.hay, L, 0.5, 5555555, rng);
      check_structure(tok, bd, p, f.hay, L, prefix, question);
      ASSERT_EQ(p.inserts.size(), 10u);
      std::set<std::string> numbers;
      int targets = 0;
      for (const eval::Insert& in : p.inserts) {
        const size_t colon = in.text.find(": ");
        ASSERT_NE(colon, std::string::npos) << in.text;
        numbers.insert(in.text.substr(colon + 2, in.text.size() - colon - 4));
        if (in.target) {
          ++targets;
          EXPECT_NE(in.text.find("Singapore"), std::string::npos);
        } else {
          EXPECT_EQ(in.text.find("Singapore"), std::string::npos) << in.text;
          bool city = false;
          for (const std::string& c : PromptBuilder::distractor_cities()) city |= in.text.find(c) != std::string::npos;
          EXPECT_TRUE(city) << in.text;
        }
      }
      EXPECT_EQ(targets, 1);
      EXPECT_EQ(numbers.size(), 10u) << "distractor numbers are not distinct";
      EXPECT_EQ(numbers.count("5555555"), 1u);
      check_answer_continues_like_the_needle(p);
    }
  }
  // The same seed gives the same prompt; another seed other distractor places.
  {
    eval::TaskOptions o2;
    o2.distractors = 3;
    const PromptBuilder bd(tok, o2);
    eval::Rng r1(11), r2(11), r3(12);
    const Prompt a = bd.needle(f.hay, L, 0.4, 42424242 % 10000000, r1),
                 c = bd.needle(f.hay, L, 0.4, 42424242 % 10000000, r2),
                 d = bd.needle(f.hay, L, 0.4, 42424242 % 10000000, r3);
    EXPECT_EQ(a.tokens, c.tokens);
    EXPECT_NE(a.tokens, d.tokens);
  }
}

void synthetic_cases(const std::string& path) {
  const std::unique_ptr<data::Tokenizer> tokp = data::load_tokenizer(path);
  const data::Tokenizer& tok = *tokp;
  eval::TaskOptions to;
  to.digits = 6;
  to.keys = 5;
  to.values = 3;
  to.hops = 3;
  const PromptBuilder b(tok, to);
  const int64_t L = 800;
  const Ids noise = b.noise_haystack(L);
  ASSERT_GE(static_cast<int64_t>(noise.size()), L);
  EXPECT_NE(trim(tok.decode(Ids(noise.begin(), noise.begin() + 40))).find("The grass is green. The sky is blue."),
            std::string::npos);
  for (Task t : {Task::Passkey, Task::MultiKey, Task::MultiValue, Task::VariableTracking}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      SCOPED_TRACE(std::string(eval::task_name(t)) + " seed " + std::to_string(seed));
      eval::Rng rng(seed);
      const Prompt p = b.synthetic(t, noise, L, rng);
      // The question is the text between the context and the answer.
      const std::string q_text = tok.decode(slice(p, p.context_end, p.answer_begin));
      std::string prefix;
      {
        eval::Rng again(seed);
        const Prompt p2 = b.synthetic(t, noise, L, again);
        EXPECT_EQ(p2.tokens, p.tokens) << "not deterministic";
      }
      switch (t) {
        case Task::Passkey: {
          ASSERT_EQ(p.inserts.size(), 1u);
          EXPECT_TRUE(p.inserts[0].target);
          EXPECT_EQ(p.answer.size(), 6u);
          EXPECT_EQ(p.inserts[0].text,
                    "\nThe pass key is " + p.answer + ". Remember it. " + p.answer + " is the pass key.\n");
          EXPECT_NE(q_text.find("What is the pass key?"), std::string::npos) << q_text;
          prefix =
              "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
              "about the pass key afterwards.\n";
          check_structure(tok, b, p, noise, L, prefix, "\nWhat is the pass key? The pass key is");
          check_answer_continues_like_the_needle(p);
          break;
        }
        case Task::MultiKey: {
          ASSERT_EQ(p.inserts.size(), 5u);
          std::set<std::string> keys, values;
          std::string asked;
          for (const eval::Insert& in : p.inserts) {
            const size_t f = in.text.find(" for "), is = in.text.find(" is: ");
            ASSERT_NE(f, std::string::npos);
            const std::string key = in.text.substr(f + 5, is - f - 5);
            keys.insert(key);
            values.insert(in.text.substr(is + 5, in.text.size() - is - 7));
            if (in.target) {
              EXPECT_TRUE(asked.empty()) << "two keys asked";
              asked = key;
              EXPECT_EQ(in.text.substr(is + 5, in.text.size() - is - 7), p.answer);
            }
          }
          EXPECT_EQ(keys.size(), 5u) << "keys not distinct";
          EXPECT_EQ(values.size(), 5u) << "values not distinct";
          ASSERT_FALSE(asked.empty());
          EXPECT_NE(q_text.find("special magic number for " + asked + " mentioned"), std::string::npos) << q_text;
          prefix =
              "Some special magic numbers are hidden within the following text. Make sure to memorize them. I "
              "will quiz you about the numbers afterwards.\n";
          check_structure(tok, b, p, noise, L, prefix,
                          "\nWhat is the special magic number for " + asked +
                              " mentioned in the provided text? The special magic number for " + asked +
                              " mentioned in the provided text is:");
          check_answer_continues_like_the_needle(p);
          break;
        }
        case Task::MultiValue: {
          ASSERT_EQ(p.inserts.size(), 3u);
          std::vector<std::string> vals;
          std::string key;
          for (const eval::Insert& in : p.inserts) {
            EXPECT_TRUE(in.target);
            const size_t f = in.text.find(" for "), is = in.text.find(" is: ");
            const std::string k = in.text.substr(f + 5, is - f - 5);
            if (key.empty()) key = k;
            EXPECT_EQ(k, key) << "one key for every value";
            vals.push_back(in.text.substr(is + 5, in.text.size() - is - 7));
          }
          EXPECT_EQ(p.answer, vals[0] + ", " + vals[1] + ", " + vals[2]) << "in order of appearance";
          EXPECT_EQ(std::set<std::string>(vals.begin(), vals.end()).size(), 3u);
          prefix =
              "Some special magic numbers are hidden within the following text. Make sure to memorize them. I "
              "will quiz you about the numbers afterwards.\n";
          check_structure(tok, b, p, noise, L, prefix,
                          "\nWhat are all the special magic numbers for " + key +
                              " mentioned in the provided text? The special magic numbers for " + key +
                              " mentioned in the provided text, in order, are:");
          break;
        }
        case Task::VariableTracking: {
          ASSERT_EQ(p.inserts.size(), 4u);
          std::vector<std::string> names;
          std::string value;
          for (size_t i = 0; i < p.inserts.size(); ++i) {
            const std::string& s = p.inserts[i].text;  // "\nVAR X = ...\n"
            ASSERT_EQ(s.substr(0, 5), "\nVAR ");
            const size_t eq = s.find(" = ");
            names.push_back(s.substr(5, eq - 5));
            const std::string rhs = s.substr(eq + 3, s.size() - eq - 5);
            if (i == 0) value = rhs;
            else EXPECT_EQ(rhs, "VAR " + names[i - 1]) << "the chain is out of order";
          }
          EXPECT_EQ(value.size(), 6u);
          EXPECT_EQ(p.answer, names[0] + " " + names[1] + " " + names[2] + " " + names[3]);
          EXPECT_NE(q_text.find("assigned the value " + value), std::string::npos) << q_text;
          EXPECT_NE(q_text.find("4 variables"), std::string::npos) << q_text;
          prefix = "Memorize and track the chain of variable assignments hidden in the following text.\n";
          check_structure(tok, b, p, noise, L, prefix,
                          "\nFind all variables that are assigned the value " + value +
                              " in the text above. Answer: According to the chain of variable assignments in the text "
                              "above, 4 variables are assigned the value " +
                              value + ", they are:");
          break;
        }
        case Task::Needle: break;
      }
    }
  }
}

TEST(NeedlePrompt, CiTokenizer) { needle_cases(demo_tokenizer()); }

TEST(NeedlePrompt, Llama2) {
  const std::string path = llama2_tokenizer();
  REQUIRE_FIXTURE_TOKENIZER(path, "the Llama-2");
  needle_cases(path);
  // EasyContext's period ids are sentence ends; the answer is "▁" then the digits, as in
  // the needle (../shared/reference/data-and-eval.md 5a).
  const auto tok = data::load_tokenizer(path);
  const PromptBuilder b(*tok, {});
  EXPECT_TRUE(b.is_sentence_end(29889));
  EXPECT_TRUE(b.is_sentence_end(869));
  EXPECT_FALSE(b.is_sentence_end(29901));  // ':'
  EXPECT_EQ(tok->encode("1234567"), (Ids{29871, 29896, 29906, 29941, 29946, 29945, 29953, 29955}));
  EXPECT_TRUE(contains(
      tok->encode(b.needle_text("Singapore", 1234567)),
      Ids{4266, 15709, 25960, 1353, 338, 29901, 29871, 29896, 29906, 29941, 29946, 29945, 29953, 29955, 29889}));
  eval::Rng rng(5);
  const Ids hay = tok->encode(haystack_text(9, 100));
  const Prompt p = b.needle(hay, 300, 0.5, 1234567, rng);
  EXPECT_EQ(p.tokens[0], 1);
  EXPECT_EQ(slice(p, p.answer_begin, static_cast<int64_t>(p.tokens.size())),
            (Ids{29871, 29896, 29906, 29941, 29946, 29945, 29953, 29955}));
  EXPECT_EQ(p.tokens[static_cast<size_t>(p.answer_begin - 1)], 29901);  // the question ends with ':'
}

TEST(NeedlePrompt, Llama3Spacing) {
  const std::string path = llama3_tokenizer();
  REQUIRE_FIXTURE_TOKENIZER(path, "the Llama-3");
  needle_cases(path);
  const auto tok = data::load_tokenizer(path);
  const PromptBuilder b(*tok, {});
  EXPECT_TRUE(b.llama3_spacing());
  EXPECT_TRUE(b.is_sentence_end(13));  // '.'
  eval::Rng rng(6);
  const Ids hay = tok->encode(haystack_text(9, 100));
  const Prompt p = b.needle(hay, 300, 0.5, 1234567, rng);
  EXPECT_EQ(p.tokens[0], 128000);  // <|begin_of_text|>
  // The question ends with the space token; the answer's digits carry none.
  const uint32_t last = static_cast<uint32_t>(p.tokens[static_cast<size_t>(p.answer_begin - 1)]);
  EXPECT_EQ(tok->decode(&last, 1), " ");
  EXPECT_EQ(tok->decode(slice(p, p.answer_begin, static_cast<int64_t>(p.tokens.size()))), "1234567");
}

TEST(SyntheticPrompt, CiTokenizer) { synthetic_cases(demo_tokenizer()); }

TEST(SyntheticPrompt, Llama2) {
  const std::string path = llama2_tokenizer();
  REQUIRE_FIXTURE_TOKENIZER(path, "the Llama-2");
  synthetic_cases(path);
}

TEST(SyntheticPrompt, Llama3) {
  const std::string path = llama3_tokenizer();
  REQUIRE_FIXTURE_TOKENIZER(path, "the Llama-3");
  synthetic_cases(path);
}

TEST(NeedlePrompt, OptionsNameTheFlag) {
  const auto tokp = data::load_tokenizer(demo_tokenizer());
  const data::Tokenizer& tok = *tokp;
  auto expect_flag = [&](eval::TaskOptions o, const std::string& flag) {
    try {
      PromptBuilder b(tok, o);
      ADD_FAILURE() << "no error for " << flag;
    } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what(); }
  };
  eval::TaskOptions o;
  o.digits = 0;
  expect_flag(o, "--digits");
  o = {};
  o.digits = 1;
  o.distractors = 8;  // 9 distinct one-digit numbers out of 10: too many
  expect_flag(o, "--digits");
  o = {};
  o.distractors = -1;
  expect_flag(o, "--distractors");
  o = {};
  o.keys = 0;
  expect_flag(o, "--keys");
  o = {};
  o.hops = 0;
  expect_flag(o, "--hops");
  EXPECT_THROW(eval::parse_task("needles"), InputError);
  EXPECT_EQ(eval::parse_task("vt"), Task::VariableTracking);
  // Numbers have exactly the digits asked.
  eval::Rng rng(1);
  for (int d = 1; d <= 18; ++d)
    for (int i = 0; i < 50; ++i) {
      const int64_t n = eval::random_number(rng, d);
      EXPECT_EQ(std::to_string(n).size(), static_cast<size_t>(d)) << n;
    }
}

// The default haystack: the KJV through `bible` (bible-kjv), what a fresh machine has after
// scripts/setup.sh: a failure, not a skip, where it is missing.
TEST(NeedleHaystack, DefaultIsTheKjv) {
  const std::string kjv = eval::kjv_text();
  ASSERT_FALSE(kjv.empty()) << "`bible` (Debian's bible-kjv, which scripts/setup.sh installs) gives no text";
  EXPECT_EQ(kjv.substr(0, 60), "In the beginning God created the heaven and the earth.\nAnd t");
  EXPECT_GT(kjv.size(), 4000000u);
  const auto tok = data::load_tokenizer(demo_tokenizer());
  const eval::Haystack h = eval::load_haystack("", *tok, 10000);
  EXPECT_GE(h.tokens.size(), 10000u);
  EXPECT_NE(h.description.find("King James"), std::string::npos);
  // The verses' tokens in order (read in 64 KiB pieces cut after a newline).
  const std::vector<uint32_t> first = tok->encode(kjv.substr(0, kjv.find('\n', 60000) + 1));
  ASSERT_GE(first.size(), 1000u);
  EXPECT_TRUE(std::equal(first.begin(), first.begin() + 1000, h.tokens.begin()));
  EXPECT_EQ(tok->decode(std::vector<uint32_t>(h.tokens.begin(), h.tokens.begin() + 4)).substr(0, 6), "In the");
}

TEST(NeedleHaystack, FoldersFilesShardsAndRepetition) {
  const auto tokp = data::load_tokenizer(demo_tokenizer());
  const data::Tokenizer& tok = *tokp;
  auto enc = [&](const std::string& s) { return tok.encode(s); };
  auto cat = [](std::vector<std::vector<uint32_t>> parts) {
    std::vector<uint32_t> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
  };
  TempDir dir("needle-hay-kinds");
  std::filesystem::create_directories(dir / "f/sub");
  write_file_atomic(dir / "f/b.txt", "Second file.");
  write_file_atomic(dir / "f/a.txt", "First file.");
  write_file_atomic(dir / "f/sub/c.jsonl", "{\"text\": \"Third, a line.\"}\n{\"text\": \"Fourth.\"}\n");
  write_file_atomic(dir / "f/skip.md", "not read");
  // Every file in path order, each text encoded on its own (a JSON line's text + "\n").
  const std::vector<uint32_t> all =
      cat({enc("First file."), enc("Second file."), enc("Third, a line.\n"), enc("Fourth.\n")});
  const eval::Haystack h = eval::load_haystack(dir / "f", tok, static_cast<int64_t>(all.size()));
  EXPECT_EQ(h.tokens, all);
  EXPECT_EQ(h.description.find("repeated"), std::string::npos);
  EXPECT_NE(h.description.find("4 document(s) from 3 file(s)"), std::string::npos) << h.description;
  // Reading stops once there are enough tokens.
  EXPECT_EQ(eval::load_haystack(dir / "f", tok, 2).tokens, enc("First file."));
  // Repeated from the start up to the length asked.
  const std::vector<uint32_t> one = enc("First file.");
  const eval::Haystack r = eval::load_haystack(dir / "f/a.txt", tok, static_cast<int64_t>(one.size() * 2 + 1));
  EXPECT_EQ(r.tokens, cat({one, one, {one[0]}}));
  EXPECT_NE(r.description.find("repeated"), std::string::npos);
  // h5tokenize shards: ids as stored, BOS/EOS dropped, the tokenizer checked.
  data::ShardMeta meta;
  meta.tokenizer_name = "kjv_bpe2000.model";
  meta.tokenizer_sha256 = tok.sha256();
  meta.vocab_size = tok.vocab_size();
  meta.bos_id = tok.bos_id();
  meta.eos_id = tok.eos_id();
  const std::vector<uint32_t> d1 = enc("Hi there."), d2 = enc("Bye!");
  {
    data::TokenShardWriter w(dir / "s.h5", meta, 64);
    const uint16_t src = w.source_index("x");
    const std::vector<uint32_t> a =
        cat({{static_cast<uint32_t>(tok.bos_id())}, d1, {static_cast<uint32_t>(tok.eos_id())}});
    const std::vector<uint32_t> b = cat({{static_cast<uint32_t>(tok.bos_id())}, d2});
    w.add_document(a.data(), a.size(), src);
    w.add_document(b.data(), b.size(), src);
    w.commit();
  }
  EXPECT_EQ(eval::load_haystack(dir / "s.h5", tok, static_cast<int64_t>(d1.size() + d2.size())).tokens, cat({d1, d2}));
  meta.tokenizer_sha256 = std::string(64, 'c');
  {
    data::TokenShardWriter w(dir / "other.h5", meta, 64);
    std::vector<uint32_t> d{1, 5};
    w.add_document(d.data(), d.size(), w.source_index("x"));
    w.commit();
  }
  try {
    eval::load_haystack(dir / "other.h5", tok, 3);
    ADD_FAILURE() << "a shard of another tokenizer was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("other.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("another tokenizer"), std::string::npos) << e.what();
  }
  std::filesystem::create_directories(dir / "empty");
  write_file_atomic(dir / "empty/x.md", "");
  auto expect_named = [&](const std::string& spec, const std::string& what) {
    for (bool check_only : {false, true}) {
      try {
        if (check_only) eval::check_haystack_source(spec);
        else eval::load_haystack(spec, tok, 3);
        ADD_FAILURE() << spec << " was read";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("--haystack-dir"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    }
  };
  EXPECT_NO_THROW(eval::check_haystack_source(dir / "f"));
  EXPECT_NO_THROW(eval::check_haystack_source(""));  // the KJV through bible-kjv
  expect_named(dir / "empty", "no .txt");
  expect_named(dir / "nope", "no such folder or file");
  expect_named(dir / "f/skip.md", "expected a folder");
}

}  // namespace
}  // namespace easyctx::test
