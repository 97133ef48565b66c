// h5synth's documents (eval/synth_docs.h): every document exactly --length tokens with BOS
// first, a prompt of easyctx_eval_needle's form ending the document (its answer last), the
// mix's proportions, determinism in (seed, i), and --mix parsing.
#include "eval/synth_docs.h"

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
      EXPECT_NE(text.substr(0, q).find(" number is: " + answer + "."), std::string::npos) << "the needle holds "
                                                                                        << answer;
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

TEST(SynthDocs, MixFlag) {
  const auto m = eval::parse_mix("needle=2, kv=0.5,text");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at(eval::DocKind::Needle), 2.0);
  EXPECT_EQ(m.at(eval::DocKind::KeyValue), 0.5);
  EXPECT_EQ(m.at(eval::DocKind::Text), 1.0);
  EXPECT_NE(input_error_of([] { eval::parse_mix("needle=1,haystack=2"); }).find("--mix: unknown document kind 'haystack'"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { eval::parse_mix("needle=-1"); }).find("--mix: weight '-1'"), std::string::npos);
  EXPECT_NE(input_error_of([] { eval::parse_mix("needle=0"); }).find("no kind a positive weight"), std::string::npos);
}

}  // namespace
}  // namespace easyctx::test
