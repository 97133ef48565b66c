// Retrieval training windows for the context-extension experiment (the h5recall tool,
// docs/data.md "h5recall", docs/results.md): windows of natural text with retrieval episodes
// of a small grammar put in, and loss weights that train only the answers (and, in a share of
// the windows, the text: language modelling).
//
// An episode states a value and later asks for it. Kinds:
//   fact     "The secret code of the red fox is 4821." ... "Question: What is the secret
//            code of the red fox? Answer: The secret code of the red fox is" + " 4821":
//            subject phrases of several forms (the attribute before or after the key, a key
//            inside the attribute: "The lucky Tandor number is: 4821."), attributes (an
//            adjective and a noun from lists), keys (an adjective and a noun, a first name, a
//            made-up proper name), question forms (most repeat the subject phrase as the
//            answer's lead, some do not: "What was ...? It was"), values (numbers of 2-10
//            digits, words, letter-digit codes)
//   passkey  "The pass key is 4821. Remember it. 4821 is the pass key." and its kin (one per
//            window: the statement carries no key)
//   list     a block of 3-12 lines "ID-4821: 77312" with random ids; one id asked
//   chain    "VAR QXKJT = 4821." ... "VAR MWPAZ = VAR QXKJT." ... asked for the second
//            variable's value (two hops), or the same in words ("Let Tandor be 4821.")
// None of the grammar's texts holds the needle evaluation's wording ("special magic"), a city
// name or its book framing (checked for every piece built: forbidden_phrase()).
//
// A window of `length` tokens: BOS, then a run of the text from a random point with the
// episodes' pieces put in after sentence ends. An episode's distance (text tokens between
// its first statement and its question) is drawn uniformly in [min_distance, max_distance]
// (0: the window), or log-uniformly (log_distance: as many in [1, 2) as in [1K, 2K), for a
// base that must first find the copy at short range), its question uniformly after that; so
// every distance up to the window is trained. Loss weights: 1 on every answer token; 1 on the text tokens too in a window
// drawn as a language-model window (lm_share of them); 0 on BOS and the grammar's other
// tokens. Window i is a pure function of (seed, i).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/tokenize/tokenizer.h"
#include "eval/retrieval.h"

namespace easyctx::eval {

enum class EpisodeKind { Fact, PassKey, List, Chain };
const char* episode_kind_name(EpisodeKind k);  // "fact", "passkey", "list", "chain"
// "fact=4,passkey=1,list=1,chain=1": InputError naming --mix.
std::map<EpisodeKind, double> parse_episode_mix(const std::string& s);

struct RecallOptions {
  int64_t length = 2048;      // tokens per window (the stage's data.seq_length)
  int episodes = 8;           // episodes per window (fewer when their pieces would fill more than half of it)
  int64_t min_distance = 0;   // statement -> question, in text tokens
  int64_t max_distance = 0;   // 0: the window
  bool log_distance = false;  // draw distances log-uniformly (as many in each octave) instead of uniformly
  double lm_share = 0.25;     // the share of windows whose text carries loss
  std::map<EpisodeKind, double> mix{
      {EpisodeKind::Fact, 4}, {EpisodeKind::PassKey, 1}, {EpisodeKind::List, 1}, {EpisodeKind::Chain, 1}};
  uint64_t seed = 1;
};
void check_recall_options(const RecallOptions& o);  // InputError naming the flag

// One episode's texts, before tokenizing.
struct Episode {
  EpisodeKind kind = EpisodeKind::Fact;
  std::vector<std::string> statements;  // in the order they go into the window
  std::string question;                 // ends where the answer starts
  std::string answer;                   // the value, encoded on its own (as the eval's answer)
};

// The first phrase of forbidden_phrases() that `text` holds (case and whitespace runs
// ignored), or "" when none.
std::string forbidden_phrase(const std::string& text);
// The needle evaluation's wording and city, and its book framing: what no training text holds.
const std::vector<std::string>& forbidden_phrases();

// An episode of kind k drawn from rng; `used` holds the keys and values the window already
// has (the new ones are added): no two episodes of a window share a key or a value.
Episode draw_episode(EpisodeKind k, Rng& rng, std::set<std::string>& used);

struct RecallWindow {
  std::vector<uint32_t> tokens;  // exactly length ids
  std::vector<uint8_t> weights;  // 0/1, one per token
  bool lm = false;               // a language-model window (its text weighted)
};

// What windows hold, summed (h5recall.json).
struct RecallTally {
  int64_t windows = 0, lm_windows = 0, tokens = 0, text_tokens = 0, weighted_tokens = 0, answer_tokens = 0;
  std::map<EpisodeKind, int64_t> episodes;
  // Episodes by distance in window tokens (end of the first statement -> start of the
  // question): [0, 128), [128, 256), [256, 512), ... (bin b >= 1 holds [64 << b, 128 << b)).
  std::vector<int64_t> distances;
  int64_t longest_distance = 0;
  void add_distance(int64_t d);
  void add(const RecallTally& o);
};

class RecallDocs {
 public:
  // `text`: the training text's ids (BOS/EOS removed), at least `length` of them.
  RecallDocs(const data::Tokenizer& tok, RecallOptions o, std::vector<uint32_t> text);
  RecallWindow window(uint64_t i, RecallTally* tally = nullptr) const;
  const RecallOptions& options() const { return o_; }

 private:
  struct Piece {
    int64_t at = 0;      // text offset it goes after
    int order = 0;       // among pieces at the same offset: statements before questions
    int episode = -1;    // the episode it belongs to
    bool first = false;  // the episode's first statement
    EpisodeKind kind = EpisodeKind::Fact;
    std::vector<uint32_t> ids;
    std::vector<uint8_t> weights;
  };
  std::vector<Piece> episode_pieces(Rng& rng, int64_t* piece_tokens) const;
  void place(std::vector<Piece>& pieces, Rng& rng, const std::vector<uint32_t>& run, int64_t T) const;
  int64_t after_sentence_end(const std::vector<uint32_t>& run, int64_t from, int64_t end) const;
  EpisodeKind draw_kind(Rng& rng) const;
  const data::Tokenizer& tok_;
  RecallOptions o_;
  std::vector<uint32_t> text_;
  std::vector<uint8_t> sentence_end_;  // per id: its text ends a sentence or a line
  std::vector<std::pair<EpisodeKind, double>> cdf_;
};

}  // namespace easyctx::eval
