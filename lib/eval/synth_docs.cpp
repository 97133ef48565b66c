#include "eval/synth_docs.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::eval {
namespace {

constexpr const char* kKindNames[] = {"text", "needle", "passkey", "multikey", "multivalue", "vt", "kv", "repeat"};
constexpr int kNumKinds = 8;

// Keys of the kv documents: adjective-noun pairs, as the multi-key task's (distinct words, so
// a key's tokens do not overlap another's by construction).
const char* const kKvAdjectives[] = {"amber", "brave", "calm",  "daring", "eager", "famous", "gentle", "hollow",
                                     "icy",   "jolly", "kind",  "lively", "noble", "odd",    "proud",  "quiet",
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
  for (const std::string& item : split(s, ',')) {
    const std::string t = trim(item);
    if (t.empty()) continue;
    const size_t eq = t.find('=');
    const std::string name = trim(t.substr(0, eq));
    int k = 0;
    while (k < kNumKinds && name != kKindNames[k]) ++k;
    EASYCTX_CHECK_INPUT(k < kNumKinds, "--mix: unknown document kind '", name,
                        "' (choose from text, needle, passkey, multikey, multivalue, vt, kv, repeat)");
    double w = 1;
    if (eq != std::string::npos) {
      const std::string v = trim(t.substr(eq + 1));
      char* end = nullptr;
      w = std::strtod(v.c_str(), &end);
      EASYCTX_CHECK_INPUT(!v.empty() && end && *end == '\0' && std::isfinite(w) && w >= 0, "--mix: weight '", v,
                          "' of ", name, " (must be a number >= 0)");
    }
    m[static_cast<DocKind>(k)] = w;
  }
  double total = 0;
  for (const auto& kv : m) total += kv.second;
  EASYCTX_CHECK_INPUT(total > 0, "--mix: '", s, "' gives no kind a positive weight");
  return m;
}

void check_synth_options(const SynthOptions& o) {
  EASYCTX_CHECK_INPUT(o.length >= 64, "--length: ", o.length, " (must be >= 64 tokens)");
  EASYCTX_CHECK_INPUT(o.prompt_min > 0 && o.prompt_min <= 1, "--prompt-min: ", o.prompt_min, " (must be in (0, 1])");
  EASYCTX_CHECK_INPUT(o.kv_pairs >= 0 && static_cast<size_t>(o.kv_pairs) <= kKvA * kKvN, "--kv-pairs: ", o.kv_pairs,
                      " (must be 0..", kKvA * kKvN, ")");
  check_task_options(o.task);
}

SynthDocs::SynthDocs(const data::Tokenizer& tok, SynthOptions o, std::vector<uint32_t> haystack)
    : tok_(tok), o_(std::move(o)), hay_(std::move(haystack)) {
  check_synth_options(o_);
  EASYCTX_CHECK_INPUT(static_cast<int64_t>(hay_.size()) >= o_.length, "--haystack-dir: ", hay_.size(),
                      " tokens, fewer than --length ", o_.length);
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
  for (int t = 0; t < 5; ++t) overhead_.push_back(overhead(static_cast<Task>(t)));
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
  const size_t want = o_.kv_pairs > 0 ? static_cast<size_t>(o_.kv_pairs)
                                      : std::min<size_t>(kKvA * kKvN, std::max<int64_t>(4, n / 48));
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

std::vector<uint32_t> SynthDocs::document(uint64_t i, DocKind* kind_out) const {
  const int64_t S = o_.length;
  Rng rng(mix_seed({o_.seed, 0x73796e7468ull, i}));
  const double u = rng.uniform();
  DocKind kind = cdf_.back().first;
  for (const auto& c : cdf_)
    if (u < c.second) {
      kind = c.first;
      break;
    }
  if (kind_out) *kind_out = kind;
  std::vector<uint32_t> doc;
  doc.reserve(static_cast<size_t>(S));
  const auto bos = [&] {
    if (tok_.bos_id() >= 0) doc.push_back(static_cast<uint32_t>(tok_.bos_id()));
  };
  // BOS + haystack text from a random point, `n` tokens in all.
  const auto text = [&](int64_t n) {
    if (n <= 0) return;
    bos();
    const int64_t rest = n - (tok_.bos_id() >= 0 ? 1 : 0);
    const uint64_t off = rng.below(hay_.size() - static_cast<uint64_t>(rest) + 1);
    doc.insert(doc.end(), hay_.begin() + static_cast<int64_t>(off), hay_.begin() + static_cast<int64_t>(off) + rest);
  };
  if (kind == DocKind::Text) {
    text(S);
  } else {
    // The prompt's length P in [prompt_min * S, S]; never a filler of BOS alone.
    // (At least the task's overhead and 16 tokens of context.)
    const int64_t fixed = kind == DocKind::KeyValue || kind == DocKind::Repeat ? 32 : overhead_.at(static_cast<size_t>(task_of(kind))) + 16;
    const int64_t lo = std::max<int64_t>(fixed, static_cast<int64_t>(std::ceil(o_.prompt_min * static_cast<double>(S))));
    EASYCTX_CHECK_INPUT(lo <= S, "--length ", S, ": too short for ", doc_kind_name(kind), " prompts (at least ", fixed,
                        " tokens)");
    int64_t P = lo >= S ? S : lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(S - lo + 1)));
    if (S - P == 1) P = S;
    text(S - P);
    std::vector<uint32_t> prompt;
    if (kind == DocKind::KeyValue) {
      prompt = key_value(rng.g(), P);
    } else if (kind == DocKind::Repeat) {
      const int64_t bos_n = tok_.bos_id() >= 0 ? 1 : 0, m = (P - bos_n) / 2;
      const uint64_t off = rng.below(hay_.size() - static_cast<uint64_t>(m + 1) + 1);
      if (bos_n) prompt.push_back(static_cast<uint32_t>(tok_.bos_id()));
      for (int copy = 0; copy < 2; ++copy)
        prompt.insert(prompt.end(), hay_.begin() + static_cast<int64_t>(off), hay_.begin() + static_cast<int64_t>(off) + m);
      if (static_cast<int64_t>(prompt.size()) < P) prompt.push_back(hay_[off + static_cast<uint64_t>(m)]);
    } else {
      // A prompt is L haystack tokens plus an overhead that depends on the draw (the keys'
      // tokens, the city): build, measure, rebuild with the same draws at the L that fits.
      const uint64_t draw = rng.g();
      const size_t city = kind == DocKind::Needle ? static_cast<size_t>(rng.below(cities_.size())) : 0;
      const double depth = rng.uniform();
      const uint64_t hay_off = rng.below(hay_.size() - static_cast<uint64_t>(P) + 1);
      const std::vector<uint32_t> hay(hay_.begin() + static_cast<int64_t>(hay_off),
                                      hay_.begin() + static_cast<int64_t>(hay_off) + P);
      int64_t L = P / 2;
      for (int attempt = 0; attempt < 4; ++attempt) {
        EASYCTX_CHECK_INPUT(L >= 1, "--length ", S, ": a ", doc_kind_name(kind), " prompt of ", P,
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
    }
    doc.insert(doc.end(), prompt.begin(), prompt.end());
  }
  EASYCTX_CHECK(static_cast<int64_t>(doc.size()) == S, "h5synth: document ", i, " has ", doc.size(), " tokens, not ",
                S);
  return doc;
}

}  // namespace easyctx::eval
