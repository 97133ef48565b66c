// h5synth's documents (eval/synth_docs.h): every document exactly --length tokens with BOS
// first, a prompt of easyctx_eval_needle's form ending the document (its answer last), the
// mix's proportions, determinism in (seed, i), and --mix parsing.
#include "eval/synth_docs.h"

#include <algorithm>
#include <set>

#include "needle_test_util.h"

namespace easyctx::test {
namespace {

std::vector<uint32_t> text_haystack(const data::Tokenizer& tok, uint64_t seed) {
  std::vector<uint32_t> ids = tok.encode(haystack_text(seed, 3000));
  return ids;
}

TEST(SynthDocs, EveryDocumentIsOneWindowEndingInItsPrompt) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::Rng rng(seed);
  eval::SynthOptions o;
  o.length = 384 + static_cast<int64_t>(rng.below(384));  // (vt prompts need up to ~280 tokens)
  o.seed = seed;
  o.task.digits = 3 + static_cast<int>(rng.below(5));
  o.mix = eval::parse_mix("text=1,needle=1,passkey=1,kv=1,repeat=1,vt=0.5");
  const eval::SynthDocs docs(*tok, o, text_haystack(*tok, seed));
  std::map<eval::DocKind, int> count;
  for (uint64_t i = 0; i < 300; ++i) {
    eval::DocKind k;
    const std::vector<uint32_t> d = docs.document(i, &k);
    ++count[k];
    ASSERT_EQ(static_cast<int64_t>(d.size()), o.length) << "document " << i << " (" << eval::doc_kind_name(k) << ")";
    ASSERT_EQ(d[0], static_cast<uint32_t>(tok->bos_id())) << "document " << i;
    EXPECT_EQ(d, docs.document(i)) << "document " << i << " is not a function of (seed, i)";
    const std::string text = tok->decode(d);
    if (k == eval::DocKind::Needle) {
      // The question of one of the cities, then the answer: the needle's number, at the end.
      const size_t q = text.rfind("Question: What is the special magic ");
      ASSERT_NE(q, std::string::npos) << text;
      const size_t colon = text.rfind("number is:");
      ASSERT_GT(colon, q);
      const std::string answer = trim(text.substr(colon + 10));
      EXPECT_EQ(static_cast<int>(answer.size()), o.task.digits) << text.substr(q);
      EXPECT_NE(text.substr(0, q).find(" number is: " + answer + "."), std::string::npos)
          << "the needle holds " << answer;
    } else if (k == eval::DocKind::Passkey) {
      const size_t q = text.rfind("What is the pass key? The pass key is");
      ASSERT_NE(q, std::string::npos) << text;
      const std::string answer = trim(text.substr(q + 37));
      EXPECT_EQ(static_cast<int>(answer.size()), o.task.digits);
      EXPECT_NE(text.find("The pass key is " + answer + ". Remember it."), std::string::npos);
    }
  }
  for (eval::DocKind k : {eval::DocKind::Text, eval::DocKind::Needle, eval::DocKind::Passkey, eval::DocKind::KeyValue,
                          eval::DocKind::Repeat})
    EXPECT_GT(count[k], 30) << eval::doc_kind_name(k);  // 300 / 5.5 = 55 expected
  EXPECT_GT(count[eval::DocKind::VariableTracking], 8);
  EXPECT_EQ(count[eval::DocKind::MultiKey], 0);
  // Another seed, other documents.
  eval::SynthOptions o2 = o;
  o2.seed = seed + 1;
  const eval::SynthDocs other(*tok, o2, text_haystack(*tok, seed));
  EXPECT_NE(other.document(0), docs.document(0));
}

TEST(SynthDocs, WholePromptsAndTheEvalOverhead) {
  const uint64_t seed = test_seed();
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::SynthOptions o;
  o.length = 300;
  o.prompt_min = 1;  // every prompt fills its document: BOS, prompt, answer
  o.seed = seed;
  o.task.digits = 4;
  o.mix = eval::parse_mix("passkey");
  const eval::SynthDocs docs(*tok, o, text_haystack(*tok, seed));
  const eval::PromptBuilder b(*tok, o.task);
  // An eval prompt of context L has L + overhead tokens.
  const std::vector<uint32_t> noise = b.noise_haystack(400);
  eval::Rng rng(seed);
  EXPECT_EQ(static_cast<int64_t>(b.synthetic(eval::Task::Passkey, noise, 150, rng).tokens.size()),
            150 + docs.overhead(eval::Task::Passkey));
  for (uint64_t i = 0; i < 20; ++i) {
    const std::vector<uint32_t> d = docs.document(i);
    const std::string text = tok->decode(d);
    EXPECT_EQ(text.find("There is a pass key hidden"), 0u) << text.substr(0, 80);  // the prompt starts the document
  }
}

// Packed windows (--prompt-max): S tokens of one run of the text source with whole prompts of
// at most prompt_max tokens put in, each city's needle and the pass key at most once, the
// tally exact, the mix's weights as token shares, and a function of (seed, i).
TEST(SynthDocs, PackedWindowsHoldShortPromptsInText) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::Rng rng(seed);
  eval::SynthOptions o;
  o.length = 4096 + static_cast<int64_t>(rng.below(4096));
  o.prompt_max = 256 + static_cast<int64_t>(rng.below(256));
  o.prompt_min = 0.5;
  o.seed = seed;
  o.task.digits = 4;
  o.mix = eval::parse_mix("text=2,needle=1,passkey=1");
  const std::vector<uint32_t> text = tok->encode(haystack_text(seed + 1, 20000));
  const eval::SynthDocs docs(*tok, o, text_haystack(*tok, seed), text);
  eval::DocTally all;
  const std::string needle_q = "Question: What is the special magic ", pk_q = "What is the pass key? The pass key is";
  for (uint64_t i = 0; i < 40; ++i) {
    eval::DocTally t;
    eval::DocKind k;
    const std::vector<uint32_t> d = docs.document(i, &k, &t);
    ASSERT_EQ(static_cast<int64_t>(d.size()), o.length) << "window " << i;
    EXPECT_EQ(k, eval::DocKind::Text);
    EXPECT_EQ(d, docs.document(i)) << "window " << i << " is not a function of (seed, i)";
    int64_t sum = 0;
    for (const auto& kv : t.tokens) sum += kv.second;
    EXPECT_EQ(sum, o.length) << "the tally covers every token of window " << i;
    EXPECT_LE(t.longest_prompt, o.prompt_max);
    EXPECT_LE(t.prompts[eval::DocKind::Passkey], 1) << "one pass key per window";
    EXPECT_LE(t.prompts[eval::DocKind::Needle], 7) << "each city once per window";
    // The questions in the window's text: as many as the tally's prompts, each city's once.
    const std::string s = tok->decode(d);
    int64_t needles = 0, keys = 0;
    std::set<std::string> cities;
    for (size_t at = s.find(needle_q); at != std::string::npos; at = s.find(needle_q, at + 1)) {
      ++needles;
      const size_t end = s.find(" number", at + needle_q.size());
      ASSERT_NE(end, std::string::npos);
      EXPECT_TRUE(cities.insert(s.substr(at + needle_q.size(), end - at - needle_q.size())).second)
          << "a city twice in window " << i;
    }
    for (size_t at = s.find(pk_q); at != std::string::npos; at = s.find(pk_q, at + 1)) ++keys;
    EXPECT_EQ(needles, t.prompts[eval::DocKind::Needle]) << "window " << i;
    EXPECT_EQ(keys, t.prompts[eval::DocKind::Passkey]) << "window " << i;
    all.add(t);
  }
  // Token shares: text at least the mix's 1/2 (more where the once-per-window limits leave the
  // prompts' share unfilled), prompts within [prompt_min x prompt_max, prompt_max].
  const double total = 40.0 * static_cast<double>(o.length);
  const double text_share = static_cast<double>(all.tokens[eval::DocKind::Text]) / total;
  EXPECT_GT(text_share, 0.45);
  EXPECT_LT(text_share, 0.8);
  EXPECT_GE(all.shortest_prompt, (o.prompt_max + 1) / 2);
  EXPECT_GT(all.prompts[eval::DocKind::Needle], 40);
  EXPECT_GT(all.prompts[eval::DocKind::Passkey], 30);
  // The text is the source's, read on: in most windows (not those that open with a prompt or a
  // short piece) the first 64 tokens after BOS stand in the text source in that order.
  int runs = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    const std::vector<uint32_t> d = docs.document(i);
    runs += std::search(text.begin(), text.end(), d.begin() + 1, d.begin() + 65) != text.end();
  }
  EXPECT_GE(runs, 20) << "windows do not start with a run of the text source";
  // Flag checks: prompt_max out of range.
  eval::SynthOptions bad = o;
  bad.prompt_max = 32;
  EXPECT_THROW(eval::check_synth_options(bad), InputError);
  bad.prompt_max = o.length + 1;
  EXPECT_THROW(eval::check_synth_options(bad), InputError);
  // A prompt_max shorter than a kind's smallest prompt: an error naming the flag, not a bad document.
  bad.prompt_max = 100;
  const std::string why = input_error_of([&] { eval::SynthDocs(*tok, bad, text_haystack(*tok, seed), text); });
  EXPECT_NE(why.find("--prompt-max 100: too short for"), std::string::npos) << why;
}

TEST(SynthDocs, MixFlag) {
  const auto m = eval::parse_mix("needle=2, kv=0.5,text");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at(eval::DocKind::Needle), 2.0);
  EXPECT_EQ(m.at(eval::DocKind::KeyValue), 0.5);
  EXPECT_EQ(m.at(eval::DocKind::Text), 1.0);
  EXPECT_NE(
      input_error_of([] { eval::parse_mix("needle=1,haystack=2"); }).find("--mix: unknown document kind 'haystack'"),
      std::string::npos);
  EXPECT_NE(input_error_of([] { eval::parse_mix("needle=-1"); }).find("--mix: weight '-1'"), std::string::npos);
  EXPECT_NE(input_error_of([] { eval::parse_mix("needle=0"); }).find("no kind a positive weight"), std::string::npos);
}

}  // namespace
}  // namespace easyctx::test
