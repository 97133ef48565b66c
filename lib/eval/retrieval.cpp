#include "eval/retrieval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::eval {
namespace {

const char* const kTaskNames[] = {"needle", "passkey", "multikey", "multivalue", "vt"};

// Keys of the multi-key task: "adjective-noun", as RULER's (word lists of this file).
const char* const kAdjectives[] = {"amber", "brave", "calm",   "daring", "eager",  "famous", "gentle", "hollow",
                                   "icy",   "jolly", "kind",   "lively", "mellow", "noble",  "odd",    "proud",
                                   "quiet", "rapid", "silent", "tidy",   "upbeat", "vivid",  "witty",  "young",
                                   "zesty", "bold",  "crisp",  "dusty",  "fierce", "grand",  "humble", "keen"};
const char* const kNouns[] = {"anchor", "badger", "candle", "desert",  "engine",  "falcon", "garden",  "harbor",
                              "island", "jacket", "kettle", "ladder",  "meadow",  "needle", "orchid",  "pepper",
                              "quartz", "river",  "saddle", "tunnel",  "violin",  "walnut", "yarrow",  "zebra",
                              "bridge", "canyon", "dragon", "feather", "glacier", "hammer", "lantern", "mirror"};
constexpr size_t kNumAdjectives = sizeof(kAdjectives) / sizeof(kAdjectives[0]);
constexpr size_t kNumNouns = sizeof(kNouns) / sizeof(kNouns[0]);

// How many distinct numbers of `digits` digits exist.
double number_capacity(int digits) { return digits <= 1 ? 10.0 : 9.0 * std::pow(10.0, digits - 1); }

std::vector<int64_t> distinct_numbers(Rng& rng, int digits, size_t count, std::set<int64_t> taken) {
  std::vector<int64_t> out;
  while (out.size() < count) {
    const int64_t n = random_number(rng, digits);
    if (taken.insert(n).second) out.push_back(n);
  }
  return out;
}

}  // namespace

const char* task_name(Task t) { return kTaskNames[static_cast<int>(t)]; }

Task parse_task(std::string_view name) {
  for (int i = 0; i < 5; ++i)
    if (name == kTaskNames[i]) return static_cast<Task>(i);
  EASYCTX_THROW_INPUT("--task: unknown task '", name, "' (choose from needle, passkey, multikey, multivalue, vt)");
}

bool is_synthetic(Task t) { return t != Task::Needle; }

std::map<int, double> parse_mix_weights(const std::string& s, const std::vector<std::string>& names,
                                        const std::string& what) {
  std::map<int, double> m;
  for (const std::string& item : split(s, ',')) {
    const std::string t = trim(item);
    if (t.empty()) continue;
    const size_t eq = t.find('=');
    const std::string name = trim(t.substr(0, eq));
    const int n = static_cast<int>(names.size());
    int k = 0;
    while (k < n && name != names[static_cast<size_t>(k)]) ++k;
    EASYCTX_CHECK_INPUT(k < n, "--mix: unknown ", what, " '", name, "' (choose from ", join(names, ", "), ")");
    double w = 1;
    if (eq != std::string::npos) {
      const std::string v = trim(t.substr(eq + 1));
      char* end = nullptr;
      w = std::strtod(v.c_str(), &end);
      EASYCTX_CHECK_INPUT(!v.empty() && end && *end == '\0' && std::isfinite(w) && w >= 0, "--mix: weight '", v,
                          "' of ", name, " (must be a number >= 0)");
    }
    m[k] = w;
  }
  double total = 0;
  for (const auto& kv : m) total += kv.second;
  EASYCTX_CHECK_INPUT(total > 0, "--mix: '", s, "' gives no kind a positive weight");
  return m;
}

void check_task_options(const TaskOptions& o) {
  EASYCTX_CHECK_INPUT(o.digits >= 1 && o.digits <= 18, "--digits: ", o.digits, " (must be 1..18)");
  EASYCTX_CHECK_INPUT(o.distractors >= 0, "--distractors: ", o.distractors, " (must be >= 0)");
  EASYCTX_CHECK_INPUT(o.keys >= 1 && static_cast<size_t>(o.keys) <= kNumAdjectives * kNumNouns, "--keys: ", o.keys,
                      " (must be 1..", kNumAdjectives * kNumNouns, ")");
  EASYCTX_CHECK_INPUT(o.values >= 1 && o.values <= 100, "--values: ", o.values, " (must be 1..100)");
  EASYCTX_CHECK_INPUT(o.hops >= 1 && o.hops <= 100, "--hops: ", o.hops, " (must be 1..100)");
  const int most = std::max({o.distractors + 1, o.keys, o.values});
  EASYCTX_CHECK_INPUT(most <= number_capacity(o.digits) / 2, "--digits ", o.digits, ": too few numbers of ", o.digits,
                      " digit(s) for ", most, " distinct ones (raise --digits or lower --distractors/--keys/--values)");
  EASYCTX_CHECK_INPUT(!o.city.empty(), "the needle's city is empty");
}

uint64_t mix_seed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (uint64_t p : parts) {
    h ^= p + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    uint64_t z = (h += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h = z ^ (z >> 31);
  }
  return h;
}

int64_t random_number(Rng& rng, int digits) {
  if (digits <= 1) return static_cast<int64_t>(rng.below(10));
  int64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(9 * lo)));
}

ScoreRequest Prompt::request() const {
  ScoreRequest r;
  r.tokens = tokens;
  r.spans.push_back({answer_begin - 1, answer_length});
  return r;
}

PromptBuilder::PromptBuilder(const data::Tokenizer& tok, TaskOptions opts) : tok_(tok), opts_(std::move(opts)) {
  check_task_options(opts_);
  llama3_ = tok_.kind() == "hf-bpe";
  const int64_t v = tok_.vocab_size();
  sentence_end_.assign(static_cast<size_t>(v), 0);
  for (int64_t id = 0; id < v; ++id) {
    if (id == tok_.bos_id() || id == tok_.eos_id()) continue;
    const uint32_t u = static_cast<uint32_t>(id);
    const std::string s = tok_.decode(&u, 1);
    bool any = false, only = true;
    for (char c : s) {
      if (c == '.' || c == '!' || c == '?') any = true;
      else if (!std::isspace(static_cast<unsigned char>(c))) only = false;
    }
    sentence_end_[static_cast<size_t>(id)] = any && only;
  }
}

bool PromptBuilder::is_sentence_end(uint32_t id) const { return id < sentence_end_.size() && sentence_end_[id]; }

int64_t PromptBuilder::after_sentence_end(const std::vector<uint32_t>& hay, int64_t end, int64_t from) const {
  for (int64_t i = std::max<int64_t>(from, 0); i < end; ++i)
    if (is_sentence_end(hay[static_cast<size_t>(i)])) return i + 1;
  return end;
}

int64_t PromptBuilder::depth_point(const std::vector<uint32_t>& hay, int64_t L, double depth) const {
  if (depth <= 0) return 0;
  const int64_t from = std::min<int64_t>(L, static_cast<int64_t>(static_cast<double>(L) * depth));
  return after_sentence_end(hay, L, from);
}

std::vector<uint32_t> PromptBuilder::encode(const std::string& text) const { return tok_.encode(text); }

const char* PromptBuilder::needle_prefix() { return "This is a very long story book: <book>"; }

std::string PromptBuilder::needle_text(const std::string& city, int64_t number) const {
  return "\nThe special magic " + city + " number is: " + std::to_string(number) + ".\n";
}

std::string PromptBuilder::needle_question(const std::string& city) const {
  return "</book>.\n Based on the content of the book, Question: What is the special magic " + city +
         " number? Answer: The special magic " + city + " number is:";
}

const std::vector<std::string>& PromptBuilder::distractor_cities() {
  static const std::vector<std::string> c{"New York", "London", "Paris", "Tokyo", "Beijing", "Berlin"};
  return c;
}

const char* PromptBuilder::noise_text() {
  return "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
}

Prompt PromptBuilder::assemble(const std::string& prefix, const std::vector<uint32_t>& hay, int64_t L,
                               std::vector<Piece> pieces, const std::string& question,
                               const std::string& answer) const {
  EASYCTX_CHECK(L >= 0 && static_cast<int64_t>(hay.size()) >= L, "prompt: a haystack of ", hay.size(),
                " tokens cut to ", L);
  EASYCTX_CHECK(!answer.empty(), "prompt: empty answer");
  Prompt p;
  auto append = [&](const std::vector<uint32_t>& ids) {
    for (uint32_t id : ids) p.tokens.push_back(static_cast<int32_t>(id));
  };
  if (tok_.bos_id() >= 0) p.tokens.push_back(static_cast<int32_t>(tok_.bos_id()));
  append(encode(prefix));
  p.context_begin = static_cast<int64_t>(p.tokens.size());
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.point < b.point; });
  int64_t pos = 0;
  for (const Piece& pc : pieces) {
    EASYCTX_CHECK(pc.point >= pos && pc.point <= L, "prompt: insertion point ", pc.point, " outside [0, ", L, "]");
    p.tokens.insert(p.tokens.end(), hay.begin() + pos, hay.begin() + pc.point);
    pos = pc.point;
    Insert ins;
    ins.at = static_cast<int64_t>(p.tokens.size());
    ins.haystack_point = pc.point;
    ins.text = pc.text;
    ins.target = pc.target;
    append(encode(pc.text));
    ins.length = static_cast<int64_t>(p.tokens.size()) - ins.at;
    p.inserts.push_back(ins);
  }
  p.tokens.insert(p.tokens.end(), hay.begin() + pos, hay.begin() + L);
  p.context_end = static_cast<int64_t>(p.tokens.size());
  // Llama-3's digits never carry the space before them (SentencePiece's do, as "▁" then
  // digits): the question ends with the space (EasyContext's README); a word answer takes
  // its space itself, as it would in running text.
  const bool digit = std::isdigit(static_cast<unsigned char>(answer[0])) != 0;
  append(encode(llama3_ && digit ? question + " " : question));
  p.answer_begin = static_cast<int64_t>(p.tokens.size());
  append(encode(llama3_ && !digit ? " " + answer : answer));
  p.answer_length = static_cast<int64_t>(p.tokens.size()) - p.answer_begin;
  p.answer = answer;
  EASYCTX_CHECK(p.answer_length > 0 && p.answer_begin > 0, "prompt: the answer '", answer, "' has no tokens");
  return p;
}

Prompt PromptBuilder::needle(const std::vector<uint32_t>& haystack, int64_t L, double depth, int64_t number,
                             Rng& rng) const {
  EASYCTX_CHECK(L >= 1 && static_cast<int64_t>(haystack.size()) >= L, "needle prompt: a haystack of ", haystack.size(),
                " tokens cut to ", L);
  std::vector<Piece> pieces;
  pieces.push_back({needle_text(opts_.city, number), depth_point(haystack, L, depth), true});
  const std::vector<int64_t> others =
      distinct_numbers(rng, opts_.digits, static_cast<size_t>(opts_.distractors), {number});
  const auto& cities = distractor_cities();
  for (size_t i = 0; i < others.size(); ++i) {
    std::string city = cities[i % cities.size()];
    if (city == opts_.city) city = cities[(i + 1) % cities.size()];
    const int64_t from = static_cast<int64_t>(rng.below(static_cast<uint64_t>(L)));
    pieces.push_back({needle_text(city, others[i]), after_sentence_end(haystack, L, from), false});
  }
  return assemble(needle_prefix(), haystack, L, pieces, needle_question(opts_.city), std::to_string(number));
}

namespace {

using Piece = PromptBuilder::Piece;

// A synthetic task's prompt before assembly: the pieces hidden in the noise, and the text
// around them.
struct TaskText {
  std::vector<Piece> pieces;
  std::string prefix, question, answer;
};

// One point of the haystack at a uniform depth (one draw of the prompt's Rng).
using PointFn = std::function<int64_t()>;

std::vector<int64_t> sorted_points(const PointFn& point, size_t n) {
  std::vector<int64_t> pts;
  for (size_t i = 0; i < n; ++i) pts.push_back(point());
  std::sort(pts.begin(), pts.end());
  return pts;
}

// passkey: one number, asked back.
TaskText passkey_text(const TaskOptions& o, Rng& rng, const PointFn& point) {
  TaskText t;
  const int64_t n = random_number(rng, o.digits);
  const std::string k = std::to_string(n);
  t.pieces.push_back({"\nThe pass key is " + k + ". Remember it. " + k + " is the pass key.\n", point(), true});
  t.prefix =
      "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
      "I will quiz you about the pass key afterwards.\n";
  t.question = "\nWhat is the pass key? The pass key is";
  t.answer = k;
  return t;
}

// multikey: a number for each of several keys; one key is asked.
TaskText multikey_text(const TaskOptions& o, Rng& rng, const PointFn& point) {
  TaskText t;
  std::set<std::string> seen;
  std::vector<std::string> keys;
  while (keys.size() < static_cast<size_t>(o.keys)) {
    const std::string k = std::string(kAdjectives[rng.below(kNumAdjectives)]) + "-" + kNouns[rng.below(kNumNouns)];
    if (seen.insert(k).second) keys.push_back(k);
  }
  const std::vector<int64_t> nums = distinct_numbers(rng, o.digits, keys.size(), {});
  const size_t asked = rng.below(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    t.pieces.push_back({"\nOne of the special magic numbers for " + keys[i] + " is: " + std::to_string(nums[i]) + ".\n",
                        point(), i == asked});
  t.prefix =
      "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
      "I will quiz you about the numbers afterwards.\n";
  t.question = "\nWhat is the special magic number for " + keys[asked] +
               " mentioned in the provided text? The special magic number for " + keys[asked] +
               " mentioned in the provided text is:";
  t.answer = std::to_string(nums[asked]);
  return t;
}

// multivalue: several numbers of one key, asked in order.
TaskText multivalue_text(const TaskOptions& o, Rng& rng, const PointFn& point) {
  TaskText t;
  const std::string key = std::string(kAdjectives[rng.below(kNumAdjectives)]) + "-" + kNouns[rng.below(kNumNouns)];
  const std::vector<int64_t> nums = distinct_numbers(rng, o.digits, static_cast<size_t>(o.values), {});
  const std::vector<int64_t> pts = sorted_points(point, nums.size());
  std::vector<std::string> vals;
  for (size_t i = 0; i < nums.size(); ++i) {
    vals.push_back(std::to_string(nums[i]));
    t.pieces.push_back({"\nOne of the special magic numbers for " + key + " is: " + vals.back() + ".\n", pts[i], true});
  }
  t.prefix =
      "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
      "I will quiz you about the numbers afterwards.\n";
  t.question = "\nWhat are all the special magic numbers for " + key +
               " mentioned in the provided text? The special magic numbers for " + key +
               " mentioned in the provided text, in order, are:";
  t.answer = join(vals, ", ");
  return t;
}

// vt: a chain of variable assignments; the variables holding the value are asked.
TaskText variable_tracking_text(const TaskOptions& o, Rng& rng, const PointFn& point) {
  TaskText t;
  std::set<std::string> seen;
  std::vector<std::string> names;
  while (names.size() < static_cast<size_t>(o.hops) + 1) {
    std::string s;
    for (int i = 0; i < 5; ++i) s.push_back(static_cast<char>('A' + rng.below(26)));
    if (seen.insert(s).second) names.push_back(s);
  }
  const std::string n = std::to_string(random_number(rng, o.digits));
  const std::vector<int64_t> pts = sorted_points(point, names.size());
  for (size_t i = 0; i < names.size(); ++i)
    t.pieces.push_back({"\nVAR " + names[i] + " = " + (i ? "VAR " + names[i - 1] : n) + ".\n", pts[i], true});
  t.prefix = "Memorize and track the chain of variable assignments hidden in the following text.\n";
  t.question = "\nFind all variables that are assigned the value " + n +
               " in the text above. Answer: According to the chain of variable assignments in the text above, " +
               std::to_string(names.size()) + " variables are assigned the value " + n + ", they are:";
  t.answer = join(names, " ");
  return t;
}

}  // namespace

Prompt PromptBuilder::synthetic(Task t, const std::vector<uint32_t>& noise, int64_t L, Rng& rng) const {
  EASYCTX_CHECK(is_synthetic(t), "synthetic prompt: ", task_name(t), " is not a synthetic task");
  EASYCTX_CHECK(L >= 1 && static_cast<int64_t>(noise.size()) >= L, "synthetic prompt: a haystack of ", noise.size(),
                " tokens cut to ", L);
  const PointFn point = [&] { return depth_point(noise, L, rng.uniform()); };
  TaskText text;
  switch (t) {
    case Task::Passkey: text = passkey_text(opts_, rng, point); break;
    case Task::MultiKey: text = multikey_text(opts_, rng, point); break;
    case Task::MultiValue: text = multivalue_text(opts_, rng, point); break;
    case Task::VariableTracking: text = variable_tracking_text(opts_, rng, point); break;
    case Task::Needle: break;
  }
  return assemble(text.prefix, noise, L, text.pieces, text.question, text.answer);
}

std::vector<uint32_t> PromptBuilder::noise_haystack(int64_t min_tokens) const {
  std::string block;
  for (int i = 0; i < 64; ++i) block += (i ? " " : "") + std::string(noise_text());
  // SentencePiece's dummy prefix stands for the space between blocks; a byte-level BPE
  // takes it in front.
  const std::vector<uint32_t> ids = encode(llama3_ ? " " + block : block);
  EASYCTX_CHECK(!ids.empty(), "noise haystack: no tokens");
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(min_tokens) + ids.size());
  while (static_cast<int64_t>(out.size()) < min_tokens) out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

}  // namespace easyctx::eval
