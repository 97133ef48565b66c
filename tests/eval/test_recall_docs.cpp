// h5recall's windows (eval/recall_docs.h): every window exactly --length tokens with BOS first;
// in a retrieval window only answers carry loss, each answer stated earlier in the window
// after its question; in a language-model window the text carries loss too; distances within
// the bounds asked; a pure function of (seed, i); the grammar never forms the needle
// evaluation's wording or city; --mix parsing.
#include "eval/recall_docs.h"

#include <algorithm>
#include <set>

#include "needle_test_util.h"

namespace easyctx::test {
namespace {

eval::RecallDocs make_docs(const data::Tokenizer& tok, eval::RecallOptions o, uint64_t seed) {
  return eval::RecallDocs(tok, std::move(o), tok.encode(haystack_text(seed, 6000)));
}

// The weight-1 runs of a window: [begin, end) token ranges.
std::vector<std::pair<size_t, size_t>> weighted_runs(const eval::RecallWindow& w) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < w.weights.size();) {
    if (!w.weights[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < w.weights.size() && w.weights[j]) ++j;
    runs.push_back({i, j});
    i = j;
  }
  return runs;
}

TEST(RecallDocs, AnswersAloneCarryLossAndWereStatedBefore) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::Rng rng(seed);
  eval::RecallOptions o;
  o.length = 512 + static_cast<int64_t>(rng.below(1024));
  o.episodes = 2 + static_cast<int>(rng.below(8));
  o.lm_share = 0.3;
  o.seed = seed;
  const eval::RecallDocs docs = make_docs(*tok, o, seed);
  eval::RecallTally tally;
  int lm = 0, answers = 0;
  for (uint64_t i = 0; i < 120; ++i) {
    const eval::RecallWindow w = docs.window(i, &tally);
    ASSERT_EQ(static_cast<int64_t>(w.tokens.size()), o.length) << "window " << i;
    ASSERT_EQ(w.weights.size(), w.tokens.size());
    ASSERT_EQ(w.tokens[0], static_cast<uint32_t>(tok->bos_id()));
    EXPECT_EQ(w.weights[0], 0);
    const eval::RecallWindow again = docs.window(i);
    EXPECT_TRUE(again.tokens == w.tokens && again.weights == w.weights) << "window " << i << " is not (seed, i)'s";
    if (w.lm) {
      ++lm;
      continue;
    }
    for (const auto& [b, e] : weighted_runs(w)) {
      // The answer: a value stated earlier in the window, right after a question's lead.
      // (A question's lead never holds its answer; numbers and codes are not in the text.)
      const std::string answer = trim(tok->decode(w.tokens.data() + b, e - b));
      const std::string before = tok->decode(w.tokens.data(), b);
      ASSERT_FALSE(answer.empty()) << "window " << i;
      EXPECT_NE(before.find(answer), std::string::npos)
          << "window " << i << ": answer '" << answer << "' was never stated before its question: " << before;
      ++answers;
    }
  }
  EXPECT_GT(lm, 20) << "lm_share 0.3 of 120 windows";  // 36 expected
  EXPECT_LT(lm, 55);
  EXPECT_GT(answers, 120 - 55);
  EXPECT_EQ(tally.windows, 120);
  EXPECT_EQ(tally.lm_windows, lm);
  int64_t episodes = 0;
  for (const auto& kv : tally.episodes) episodes += kv.second;
  EXPECT_GE(episodes, 120);
  EXPECT_GE(tally.answer_tokens, episodes);
}

TEST(RecallDocs, LanguageModelWindowsWeightTheirText) {
  const uint64_t seed = test_seed();
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::RecallOptions o;
  o.length = 1024;
  o.episodes = 4;
  o.seed = seed;
  o.lm_share = 1;
  const eval::RecallDocs all = make_docs(*tok, o, seed);
  o.lm_share = 0;
  const eval::RecallDocs none = make_docs(*tok, o, seed);
  for (uint64_t i = 0; i < 20; ++i) {
    const eval::RecallWindow a = all.window(i), n = none.window(i);
    EXPECT_TRUE(a.lm);
    EXPECT_FALSE(n.lm);
    const int64_t wa = std::count(a.weights.begin(), a.weights.end(), 1);
    const int64_t wn = std::count(n.weights.begin(), n.weights.end(), 1);
    EXPECT_GT(wa, o.length / 2) << "window " << i << ": the text of a language-model window carries loss";
    EXPECT_LT(wn, o.length / 8) << "window " << i << ": only answers carry loss";
  }
}

TEST(RecallDocs, DistancesStayWithinTheBoundsAsked) {
  const uint64_t seed = test_seed();
  const auto tok = data::load_tokenizer(demo_tokenizer());
  eval::RecallOptions o;
  o.length = 4096;
  o.episodes = 2;
  o.seed = seed;
  o.lm_share = 0;
  eval::RecallTally whole, near, far;
  const eval::RecallDocs any = make_docs(*tok, o, seed);
  o.max_distance = 100;
  const eval::RecallDocs close = make_docs(*tok, o, seed);
  o.max_distance = 0;
  o.min_distance = 2000;
  const eval::RecallDocs distant = make_docs(*tok, o, seed);
  for (uint64_t i = 0; i < 100; ++i) {
    any.window(i, &whole);
    close.window(i, &near);
    distant.window(i, &far);
  }
  // The whole window: distances up to near its length, in every bin from 0 to 2K.
  EXPECT_GT(whole.longest_distance, 3 * o.length / 4);
  ASSERT_GE(whole.distances.size(), 5u);
  for (size_t b = 0; b < 5; ++b) EXPECT_GT(whole.distances[b], 0) << "bin " << b;
  // At most 100 text tokens apart (+ a sentence-end snap of at most 256, + the other episode).
  EXPECT_LT(near.longest_distance, 100 + 256 + 200);
  // Log-uniform: as many in every octave, so a third or more below 128 of a 4K window (a
  // uniform law puts about 3% there).
  eval::RecallTally logd;
  o.min_distance = 0;
  o.log_distance = true;
  const eval::RecallDocs octaves = make_docs(*tok, o, seed);
  for (uint64_t i = 0; i < 100; ++i) octaves.window(i, &logd);
  int64_t all = 0;
  for (int64_t x : logd.distances) all += x;
  EXPECT_GT(3 * logd.distances[0], all) << "log-uniform: " << logd.distances[0] << " of " << all << " below 128";
  EXPECT_LT(10 * whole.distances[0], 2 * all) << "uniform: " << whole.distances[0] << " of " << all << " below 128";
  EXPECT_GT(logd.longest_distance, o.length / 2);
  // At least 2000 apart (less the statement's snap of at most 256): nothing below 1K.
  for (size_t b = 0; b < 4 && b < far.distances.size(); ++b) EXPECT_EQ(far.distances[b], 0) << "bin " << b;
}

TEST(RecallDocs, TheGrammarNeverFormsTheEvaluationsWording) {
  const uint64_t seed = test_seed();
  eval::Rng rng(seed);
  std::set<std::string> questions;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 5000; ++i) {
      std::set<std::string> used;
      const eval::Episode e = eval::draw_episode(static_cast<eval::EpisodeKind>(k), rng, used);
      std::string all = e.question + " " + e.answer;
      for (const std::string& s : e.statements) all += " " + s;
      ASSERT_EQ(eval::forbidden_phrase(all), "") << all;
      ASSERT_FALSE(e.answer.empty());
      ASSERT_FALSE(e.statements.empty());
      // The value is stated (a chain states it in its first statement).
      EXPECT_NE(e.statements[0].find(e.answer), std::string::npos) << all;
      questions.insert(e.question.substr(0, 12));
    }
  EXPECT_GT(questions.size(), 10u) << "question forms vary";
  EXPECT_EQ(eval::forbidden_phrase("The Special\n  MAGIC Berlin number"), "special magic");
  EXPECT_EQ(eval::forbidden_phrase("flights to SINGAPORE."), "singapore");
  EXPECT_EQ(eval::forbidden_phrase("This is a very long story  book: <book>"), "story book");
  EXPECT_EQ(eval::forbidden_phrase("a special, magic number"), "");
}

TEST(RecallDocs, FlagErrorsNameTheFlag) {
  EXPECT_THROW(eval::parse_episode_mix("fact=1,needle=2"), InputError);
  EXPECT_THROW(eval::parse_episode_mix("fact=0"), InputError);
  EXPECT_THROW(eval::parse_episode_mix("fact=x"), InputError);
  const auto m = eval::parse_episode_mix("fact=3, chain=0.5");
  EXPECT_EQ(m.at(eval::EpisodeKind::Fact), 3);
  EXPECT_EQ(m.at(eval::EpisodeKind::Chain), 0.5);
  eval::RecallOptions o;
  o.length = 64;
  EXPECT_THROW(eval::check_recall_options(o), InputError);
  o.length = 1024;
  o.min_distance = 500;
  o.max_distance = 100;
  EXPECT_THROW(eval::check_recall_options(o), InputError);
  o.max_distance = 0;
  o.lm_share = 1.5;
  EXPECT_THROW(eval::check_recall_options(o), InputError);
}

}  // namespace
}  // namespace easyctx::test
