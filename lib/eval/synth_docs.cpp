#include "eval/synth_docs.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "core/error.h"

namespace easyctx::eval {
namespace {

constexpr const char* kKindNames[] = {"text", "needle", "passkey", "multikey", "multivalue", "vt", "kv", "repeat"};

// Keys of the kv documents: adjective-noun pairs, as the multi-key task's (distinct words, so
// a key's tokens do not overlap another's by construction).
const char* const kKvAdjectives[] = {"amber", "brave",  "calm", "daring", "eager", "famous", "gentle", "hollow",
                                     "icy",   "jolly",  "kind", "lively", "noble", "odd",    "proud",  "quiet",
                                     "rapid", "silent", "tidy", "vivid",  "witty", "young",  "bold",   "crisp"};
const char* const kKvNouns[] = {"anchor", "badger", "candle", "desert", "engine", "falcon", "garden", "harbor",
                                "island", "jacket", "kettle", "ladder", "meadow", "needle", "orchid", "pepper",
                                "quartz", "river",  "saddle", "tunnel", "violin", "walnut", "zebra",  "bridge"};
constexpr size_t kKvA = sizeof(kKvAdjectives) / sizeof(kKvAdjectives[0]);
constexpr size_t kKvN = sizeof(kKvNouns) / sizeof(kKvNouns[0]);

Task task_of(DocKind k) {
  switch (k) {
    case DocKind::Needle: return Task::Needle;
    case DocKind::Passkey: return Task::Passkey;
    case DocKind::MultiKey: return Task::MultiKey;
    case DocKind::MultiValue: return Task::MultiValue;
    case DocKind::VariableTracking: return Task::VariableTracking;
    default: EASYCTX_THROW("document kind ", doc_kind_name(k), " is not an eval task");
  }
}

}  // namespace

const char* doc_kind_name(DocKind k) { return kKindNames[static_cast<int>(k)]; }

std::map<DocKind, double> parse_mix(const std::string& s) {
  std::map<DocKind, double> m;
  for (const auto& kv : parse_mix_weights(s, {std::begin(kKindNames), std::end(kKindNames)}, "document kind"))
    m[static_cast<DocKind>(kv.first)] = kv.second;
  return m;
}

void check_synth_options(const SynthOptions& o) {
  EASYCTX_CHECK_INPUT(o.length >= 64, "--length: ", o.length, " (must be >= 64 tokens)");
  EASYCTX_CHECK_INPUT(o.prompt_min > 0 && o.prompt_min <= 1, "--prompt-min: ", o.prompt_min, " (must be in (0, 1])");
  EASYCTX_CHECK_INPUT(o.prompt_max == 0 || (o.prompt_max >= 64 && o.prompt_max <= o.length),
                      "--prompt-max: ", o.prompt_max, " (must be 0, or 64..--length ", o.length, ")");
  EASYCTX_CHECK_INPUT(o.kv_pairs >= 0 && static_cast<size_t>(o.kv_pairs) <= kKvA * kKvN, "--kv-pairs: ", o.kv_pairs,
                      " (must be 0..", kKvA * kKvN, ")");
  check_task_options(o.task);
}

void DocTally::add_prompt(DocKind kind, int64_t n) {
  tokens[kind] += n;
  ++prompts[kind];
  shortest_prompt = shortest_prompt == 0 ? n : std::min(shortest_prompt, n);
  longest_prompt = std::max(longest_prompt, n);
}

void DocTally::add(const DocTally& o) {
  for (const auto& kv : o.tokens) tokens[kv.first] += kv.second;
  for (const auto& kv : o.prompts) prompts[kv.first] += kv.second;
  if (o.shortest_prompt > 0)
    shortest_prompt = shortest_prompt == 0 ? o.shortest_prompt : std::min(shortest_prompt, o.shortest_prompt);
  longest_prompt = std::max(longest_prompt, o.longest_prompt);
}

SynthDocs::SynthDocs(const data::Tokenizer& tok, SynthOptions o, std::vector<uint32_t> haystack,
                     std::vector<uint32_t> text)
    : tok_(tok), o_(std::move(o)), hay_(std::move(haystack)), text_(std::move(text)) {
  check_synth_options(o_);
  const int64_t hay_need = o_.prompt_max > 0 ? o_.prompt_max : o_.length;
  EASYCTX_CHECK_INPUT(static_cast<int64_t>(hay_.size()) >= hay_need, "--haystack-dir: ", hay_.size(),
                      " tokens, fewer than ", o_.prompt_max > 0 ? "--prompt-max " : "--length ", hay_need);
  EASYCTX_CHECK_INPUT(text_.empty() || static_cast<int64_t>(text_.size()) >= o_.length, "--text-dir: ", text_.size(),
                      " tokens, fewer than --length ", o_.length);
  if (o_.prompt_max > 0 && text_.empty())
    EASYCTX_CHECK_INPUT(static_cast<int64_t>(hay_.size()) >= o_.length, "--haystack-dir: ", hay_.size(),
                        " tokens, fewer than --length ", o_.length, " (the packed windows' text; or give --text-dir)");
  std::vector<std::string> cities{"Singapore"};
  for (const std::string& c : PromptBuilder::distractor_cities()) cities.push_back(c);
  for (const std::string& c : cities) {
    TaskOptions t = o_.task;
    t.city = c;
    t.distractors = 0;
    cities_.push_back(std::make_unique<PromptBuilder>(tok_, t));
  }
  noise_ = cities_[0]->noise_haystack(o_.length);
  double total = 0;
  for (const auto& kv : o_.mix) total += kv.second;
  double acc = 0;
  for (const auto& kv : o_.mix)
    if (kv.second > 0) cdf_.push_back({kv.first, (acc += kv.second) / total});
  EASYCTX_CHECK_INPUT(!cdf_.empty(), "--mix: no kind has a positive weight");
  cdf_.back().second = 1.0;
  // Packed windows: the prompt kinds' weights against text's are token shares.
  double prompt_total = 0;
  for (const auto& kv : o_.mix)
    if (kv.first != DocKind::Text) prompt_total += kv.second;
  prompt_share_ = prompt_total / total;
  acc = 0;
  for (const auto& kv : o_.mix)
    if (kv.first != DocKind::Text && kv.second > 0)
      prompt_cdf_.push_back({kv.first, (acc += kv.second) / prompt_total});
  if (!prompt_cdf_.empty()) prompt_cdf_.back().second = 1.0;
  for (int t = 0; t < 5; ++t) overhead_.push_back(overhead(static_cast<Task>(t)));
  if (o_.prompt_max > 0)
    for (const auto& c : prompt_cdf_)
      EASYCTX_CHECK_INPUT(min_prompt(c.first) <= o_.prompt_max, "--prompt-max ", o_.prompt_max, ": too short for ",
                          doc_kind_name(c.first), " prompts (at least ", min_prompt(c.first), " tokens)");
}

int64_t SynthDocs::overhead(Task t) const {
  Rng rng(mix_seed({o_.seed, 0x6f76657268656164ull}));
  const int64_t L = std::min<int64_t>(64, o_.length / 2);
  const Prompt p = t == Task::Needle ? cities_[0]->needle(hay_, L, 0.5, random_number(rng, o_.task.digits), rng)
                                     : cities_[0]->synthetic(t, noise_, L, rng);
  return static_cast<int64_t>(p.tokens.size()) - L;
}

std::vector<uint32_t> SynthDocs::key_value(uint64_t seed, int64_t n) const {
  Rng rng(seed);
  const size_t want =
      o_.kv_pairs > 0 ? static_cast<size_t>(o_.kv_pairs) : std::min<size_t>(kKvA * kKvN, std::max<int64_t>(4, n / 48));
  std::set<size_t> seen;
  std::vector<std::string> keys, values;
  while (keys.size() < want) {
    const size_t k = rng.below(kKvA * kKvN);
    if (!seen.insert(k).second) continue;
    keys.push_back(std::string(kKvAdjectives[k / kKvN]) + "-" + kKvNouns[k % kKvN]);
    values.push_back(std::to_string(random_number(rng, o_.task.digits)));
  }
  std::vector<uint32_t> out;
  if (tok_.bos_id() >= 0) out.push_back(static_cast<uint32_t>(tok_.bos_id()));
  const PromptBuilder& b = *cities_[0];
  auto add = [&](const std::string& text) {
    const std::vector<uint32_t> ids = b.encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  add("Remember the value of every key below. I will ask about them afterwards.\n");
  // Definitions up to about half the document, queries (each answered by copying) after.
  size_t defined = 0;
  while (defined < keys.size() && static_cast<int64_t>(out.size()) < n / 2) {
    add("\nThe value of " + keys[defined] + " is " + values[defined] + ".");
    ++defined;
  }
  if (defined == 0) defined = 1;
  while (static_cast<int64_t>(out.size()) < n) {
    const size_t q = rng.below(defined);
    add("\nWhat is the value of " + keys[q] + "? The value of " + keys[q] + " is " + values[q] + ".");
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

int64_t SynthDocs::min_prompt(DocKind kind) const {
  // At least the task's overhead and 16 tokens of context.
  return kind == DocKind::KeyValue || kind == DocKind::Repeat ? 32
                                                              : overhead_.at(static_cast<size_t>(task_of(kind))) + 16;
}

DocKind SynthDocs::draw_kind(Rng& rng, const std::vector<std::pair<DocKind, double>>& cdf) {
  const double u = rng.uniform();
  for (const auto& c : cdf)
    if (u < c.second) return c.first;
  return cdf.back().first;
}

std::vector<uint32_t> SynthDocs::prompt(DocKind kind, int64_t P, Rng& rng, int64_t city_index) const {
  std::vector<uint32_t> prompt;
  if (kind == DocKind::KeyValue) return key_value(rng.g(), P);
  if (kind == DocKind::Repeat) {
    const int64_t bos_n = tok_.bos_id() >= 0 ? 1 : 0, m = (P - bos_n) / 2;
    const uint64_t off = rng.below(hay_.size() - static_cast<uint64_t>(m + 1) + 1);
    if (bos_n) prompt.push_back(static_cast<uint32_t>(tok_.bos_id()));
    for (int copy = 0; copy < 2; ++copy)
      prompt.insert(prompt.end(), hay_.begin() + static_cast<int64_t>(off),
                    hay_.begin() + static_cast<int64_t>(off) + m);
    if (static_cast<int64_t>(prompt.size()) < P) prompt.push_back(hay_[off + static_cast<uint64_t>(m)]);
    return prompt;
  }
  // A prompt is L haystack tokens plus an overhead that depends on the draw (the keys'
  // tokens, the city): build, measure, rebuild with the same draws at the L that fits.
  const uint64_t draw = rng.g();
  const size_t city = kind != DocKind::Needle ? 0
                      : city_index >= 0       ? static_cast<size_t>(city_index)
                                              : static_cast<size_t>(rng.below(cities_.size()));
  const double depth = rng.uniform();
  const uint64_t hay_off = rng.below(hay_.size() - static_cast<uint64_t>(P) + 1);
  const std::vector<uint32_t> hay(hay_.begin() + static_cast<int64_t>(hay_off),
                                  hay_.begin() + static_cast<int64_t>(hay_off) + P);
  int64_t L = P / 2;
  for (int attempt = 0; attempt < 4; ++attempt) {
    EASYCTX_CHECK_INPUT(L >= 1, "--length ", o_.length, ": a ", doc_kind_name(kind), " prompt of ", P,
                        " tokens leaves no room for its context (raise --prompt-min or --length)");
    Rng r(draw);
    const PromptBuilder& b = builder_for_city(city);
    const Prompt p = kind == DocKind::Needle ? b.needle(hay, L, depth, random_number(r, o_.task.digits), r)
                                             : b.synthetic(task_of(kind), noise_, L, r);
    const int64_t got = static_cast<int64_t>(p.tokens.size());
    if (got == P) {
      prompt.assign(p.tokens.begin(), p.tokens.end());
      break;
    }
    L += P - got;
  }
  EASYCTX_CHECK(static_cast<int64_t>(prompt.size()) == P, "h5synth: a ", doc_kind_name(kind),
                " prompt did not come out at ", P, " tokens");
  return prompt;
}

std::vector<uint32_t> SynthDocs::document(uint64_t i, DocKind* kind_out, DocTally* tally) const {
  if (o_.prompt_max > 0) {
    if (kind_out) *kind_out = DocKind::Text;
    return packed_document(i, tally);
  }
  const int64_t S = o_.length;
  Rng rng(mix_seed({o_.seed, 0x73796e7468ull, i}));
  const DocKind kind = draw_kind(rng, cdf_);
  if (kind_out) *kind_out = kind;
  std::vector<uint32_t> doc;
  doc.reserve(static_cast<size_t>(S));
  // BOS + haystack text from a random point, `n` tokens in all.
  const auto text = [&](int64_t n) {
    if (n <= 0) return;
    if (tok_.bos_id() >= 0) doc.push_back(static_cast<uint32_t>(tok_.bos_id()));
    const int64_t rest = n - (tok_.bos_id() >= 0 ? 1 : 0);
    const uint64_t off = rng.below(hay_.size() - static_cast<uint64_t>(rest) + 1);
    doc.insert(doc.end(), hay_.begin() + static_cast<int64_t>(off), hay_.begin() + static_cast<int64_t>(off) + rest);
  };
  if (kind == DocKind::Text) {
    text(S);
    if (tally) tally->tokens[DocKind::Text] += S;
  } else {
    // The prompt's length P in [prompt_min * S, S]; never a filler of BOS alone.
    const int64_t fixed = min_prompt(kind);
    const int64_t lo =
        std::max<int64_t>(fixed, static_cast<int64_t>(std::ceil(o_.prompt_min * static_cast<double>(S))));
    EASYCTX_CHECK_INPUT(lo <= S, "--length ", S, ": too short for ", doc_kind_name(kind), " prompts (at least ", fixed,
                        " tokens)");
    int64_t P = lo >= S ? S : lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(S - lo + 1)));
    if (S - P == 1) P = S;
    text(S - P);
    const std::vector<uint32_t> p = prompt(kind, P, rng);
    doc.insert(doc.end(), p.begin(), p.end());
    if (tally) {
      tally->tokens[DocKind::Text] += S - P;
      tally->add_prompt(kind, P);
    }
  }
  EASYCTX_CHECK(static_cast<int64_t>(doc.size()) == S, "h5synth: document ", i, " has ", doc.size(), " tokens, not ",
                S);
  return doc;
}

std::vector<uint32_t> SynthDocs::packed_document(uint64_t i, DocTally* tally) const {
  const int64_t S = o_.length, bos_n = tok_.bos_id() >= 0 ? 1 : 0;
  Rng rng(mix_seed({o_.seed, 0x7061636b6564ull, i}));
  // The prompts: kinds by weight, lengths in [prompt_min * prompt_max, prompt_max], until their
  // tokens reach the prompt kinds' share of the window (the last one kept with the probability
  // that makes the expected share exact). Each city's needle and each synthetic task at most
  // once per window: an earlier prompt of the same wording further back would be a distractor
  // the model is trained to pass over for being far, a habit against retrieval at distance.
  std::vector<std::pair<DocKind, std::vector<uint32_t>>> prompts;
  std::set<size_t> cities_used;
  std::set<DocKind> tasks_used;
  int64_t used = 0;
  const double budget = prompt_share_ * static_cast<double>(S);
  for (int tries = 0; !prompt_cdf_.empty() && static_cast<double>(used) < budget && tries < 64; ++tries) {
    const DocKind kind = draw_kind(rng, prompt_cdf_);
    int64_t city = -1;
    if (kind == DocKind::Needle) {
      std::vector<size_t> free;
      for (size_t c = 0; c < cities_.size(); ++c)
        if (!cities_used.count(c)) free.push_back(c);
      if (free.empty()) continue;
      city = static_cast<int64_t>(free[rng.below(free.size())]);
    } else if (kind != DocKind::KeyValue && kind != DocKind::Repeat && tasks_used.count(kind)) {
      continue;
    }
    const int64_t lo = std::max<int64_t>(
        min_prompt(kind), static_cast<int64_t>(std::ceil(o_.prompt_min * static_cast<double>(o_.prompt_max))));
    const int64_t P = lo >= o_.prompt_max
                          ? o_.prompt_max
                          : lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(o_.prompt_max - lo + 1)));
    const double room = budget - static_cast<double>(used);
    if (static_cast<double>(P) > room && rng.uniform() * static_cast<double>(P) >= room) break;
    if (used + P > S) break;
    prompts.push_back({kind, prompt(kind, P, rng, city)});
    if (city >= 0) cities_used.insert(static_cast<size_t>(city));
    tasks_used.insert(kind);
    used += P;
  }
  // The text: one run from a random point of the text source, read on across the window, cut
  // at random points into one piece before each prompt and one after the last; every
  // non-empty piece starts with BOS (a document boundary, as packed pretraining marks it).
  const int64_t T = S - used;
  std::vector<int64_t> cuts{0, T};
  for (size_t k = 0; k < prompts.size(); ++k)
    cuts.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(T + 1))));
  std::sort(cuts.begin(), cuts.end());
  const std::vector<uint32_t>& src = text_.empty() ? hay_ : text_;
  uint64_t off = rng.below(src.size() - static_cast<uint64_t>(T) + 1);
  std::vector<uint32_t> doc;
  doc.reserve(static_cast<size_t>(S));
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    int64_t n = cuts[k + 1] - cuts[k];
    if (n > 0 && bos_n) {
      doc.push_back(static_cast<uint32_t>(tok_.bos_id()));
      --n;
    }
    doc.insert(doc.end(), src.begin() + static_cast<int64_t>(off), src.begin() + static_cast<int64_t>(off) + n);
    off += static_cast<uint64_t>(n);
    if (tally) tally->tokens[DocKind::Text] += cuts[k + 1] - cuts[k];
    if (k < prompts.size()) {
      doc.insert(doc.end(), prompts[k].second.begin(), prompts[k].second.end());
      if (tally) tally->add_prompt(prompts[k].first, static_cast<int64_t>(prompts[k].second.size()));
    }
  }
  EASYCTX_CHECK(static_cast<int64_t>(doc.size()) == S, "h5synth: packed document ", i, " has ", doc.size(),
                " tokens, not ", S);
  return doc;
}

}  // namespace easyctx::eval
