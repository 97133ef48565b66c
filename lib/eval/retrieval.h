// Retrieval prompts: EasyContext's needle in a haystack and RULER-style synthetic tasks that
// need no data (docs/eval.md). Every prompt is token ids built piece by piece as EasyContext
// builds them (each piece encoded on its own, BOS only at the start), with the answer
// appended, so one forward pass scores it by teacher forcing: correct iff every answer token
// is the argmax (ScoreRequest's one span covers the predictions of the answer tokens).
//
// Needle (EasyContext's eval_needle.py): the haystack is cut to the context length L; the
// needle "\nThe special magic {city} number is: {n}.\n" goes after the first sentence-end
// token at or after int(L * depth) (depth 0: the very start; no sentence end up to L: the
// end); distractors with other cities go after the first sentence end at or after a random
// point. The prompt is BOS + "This is a very long story book: <book>" + the context +
// "</book>.\n Based on the content of the book, Question: What is the special magic {city}
// number? Answer: The special magic {city} number is:" (with a trailing space for Llama-3's
// byte-level BPE, whose digits do not carry the space as SentencePiece's do) + the answer
// (the digits of n). L counts the haystack's tokens; the needles, prefix, question and answer
// come on top, as in EasyContext.
//
// Synthetic tasks use a noise haystack (the same five sentences over and over) cut to L:
//   passkey     one pass key at a random depth; "What is the pass key?"
//   multikey    `keys` needles "One of the special magic numbers for {key} is: {n}." with
//               distinct adjective-noun keys; one key is asked
//   multivalue  `values` needles with the same key; all values asked, in order of appearance
//   vt          variable tracking: "VAR A = n." then `hops` assignments "VAR B = VAR A." in
//               order; every variable that holds n is asked, in chain order
#pragma once
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenize/tokenizer.h"
#include "eval/session.h"

namespace easyctx::eval {

enum class Task { Needle, Passkey, MultiKey, MultiValue, VariableTracking };
const char* task_name(Task t);           // "needle", "passkey", "multikey", "multivalue", "vt"
Task parse_task(std::string_view name);  // InputError naming --task and the choices
bool is_synthetic(Task t);               // every task but the needle

// Parses a --mix value "name=weight,..." (a name alone weighs 1; a later entry of a name wins)
// over the kinds `names`, a kind's value being its index there. InputError naming --mix: a name
// not among them (an unknown `what`, the choices listed), a weight that is not a number >= 0,
// no kind with a positive weight. h5synth's document kinds and h5recall's episode kinds.
std::map<int, double> parse_mix_weights(const std::string& s, const std::vector<std::string>& names,
                                        const std::string& what);

struct TaskOptions {
  int digits = 7;       // of every number (needle, pass key, values)
  int distractors = 0;  // needle: other cities' needles
  int keys = 4;         // multikey
  int values = 4;       // multivalue
  int hops = 4;         // vt: assignments after the first
  std::string city = "Singapore";
};
void check_task_options(const TaskOptions& o);  // InputError naming the flag

// One inserted piece of text (needle, distractor, key, assignment) in Prompt::tokens.
struct Insert {
  int64_t at = 0;              // index of its first token in Prompt::tokens
  int64_t length = 0;          // tokens
  int64_t haystack_point = 0;  // where in the haystack (0..L) it went
  std::string text;
  bool target = false;  // carries (part of) the answer
};

struct Prompt {
  std::vector<int32_t> tokens;                  // BOS, prefix, context (haystack + inserts), question, answer
  int64_t context_begin = 0, context_end = 0;   // [begin, end) of the context in tokens
  int64_t answer_begin = 0, answer_length = 0;  // the answer's tokens: [begin, begin + length)
  std::string answer;                           // its text
  std::vector<Insert> inserts;                  // in order of position
  // The tokens and one span: the predictions at positions answer_begin - 1 ... of the
  // answer's tokens.
  ScoreRequest request() const;
};

// Draws from a seeded 64-bit generator with fixed arithmetic (the same on every rank and
// every standard library).
struct Rng {
  explicit Rng(uint64_t seed) : g(seed) {}
  uint64_t below(uint64_t n) { return n ? g() % n : 0; }
  double uniform() { return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  std::mt19937_64 g;
};
// A well-mixed seed from several values (splitmix64), for per-cell generators.
uint64_t mix_seed(std::initializer_list<uint64_t> parts);
// A number of exactly `digits` digits (0-9 for one digit).
int64_t random_number(Rng& rng, int digits);

class PromptBuilder {
 public:
  PromptBuilder(const data::Tokenizer& tok, TaskOptions opts);

  const data::Tokenizer& tokenizer() const { return tok_; }
  const TaskOptions& options() const { return opts_; }
  // Llama-3's byte-level BPE (tokenizer kind "hf-bpe"): questions end with a space.
  bool llama3_spacing() const { return llama3_; }
  // A token whose text, without whitespace, is one or more of . ! ? (e.g. "." and "▁.").
  bool is_sentence_end(uint32_t id) const;
  // Index just after the first sentence-end token of hay[from, end); end when none.
  int64_t after_sentence_end(const std::vector<uint32_t>& hay, int64_t end, int64_t from) const;
  // Where a needle at `depth` goes in a haystack cut to L: 0 for depth 0, else
  // after_sentence_end(hay, L, int(L * depth)).
  int64_t depth_point(const std::vector<uint32_t>& hay, int64_t L, double depth) const;

  // Ids of a piece of text as it follows other text (no BOS: EasyContext's encode(s)[1:]).
  std::vector<uint32_t> encode(const std::string& text) const;

  // EasyContext's prompt for haystack[0, L) (haystack.size() >= L), the needle at `depth`
  // holding `number`; distractors (their numbers distinct from it and from each other) at
  // points drawn from rng.
  Prompt needle(const std::vector<uint32_t>& haystack, int64_t L, double depth, int64_t number, Rng& rng) const;
  // A synthetic task's prompt over noise[0, L) (noise.size() >= L: noise_haystack()).
  Prompt synthetic(Task t, const std::vector<uint32_t>& noise, int64_t L, Rng& rng) const;
  // The noise haystack of the synthetic tasks, at least `min_tokens` long.
  std::vector<uint32_t> noise_haystack(int64_t min_tokens) const;

  // The texts of the pieces, for tests and docs.
  static const char* needle_prefix();  // "This is a very long story book: <book>"
  std::string needle_text(const std::string& city, int64_t number) const;
  std::string needle_question(const std::string& city) const;  // with Llama-3's trailing space
  static const std::vector<std::string>& distractor_cities();
  static const char* noise_text();

  struct Piece {
    std::string text;
    int64_t point = 0;  // haystack position 0..L
    bool target = false;
  };
  // Assembles BOS + encode(prefix) + hay[0, L) with the pieces inserted (stable by point) +
  // encode(question) + encode(answer).
  Prompt assemble(const std::string& prefix, const std::vector<uint32_t>& hay, int64_t L, std::vector<Piece> pieces,
                  const std::string& question, const std::string& answer) const;

 private:
  std::string question_end(std::string q) const;
  const data::Tokenizer& tok_;
  TaskOptions opts_;
  bool llama3_ = false;
  std::vector<uint8_t> sentence_end_;  // per id
};

}  // namespace easyctx::eval
