// Synthetic retrieval training documents (the h5synth tool, docs/data.md): documents of
// exactly `length` tokens whose prompts have exactly the form easyctx_eval_needle scores
// (eval::PromptBuilder), so a model can be taught retrieval at a length and then extended.
//
// Every document is `length` tokens, so the trainer's sampler (windows [j*S, j*S + S + 1) of
// the token stream, docs/data.md "Sampler") with data.seq_length = length sees document j
// plus the next document's BOS in window j: no window holds two prompts. Kinds:
//   text        BOS + haystack text from a random point (language-model loss)
//   needle      filler + EasyContext's needle prompt over haystack text (random city, depth,
//               number): question and answer at the end of the document
//   passkey, multikey, multivalue, vt
//               filler + the synthetic task's prompt over the noise haystack
//   kv          dense key-value recall: BOS, "key: value" lines, then queries "key? value"
//               over them to the end: many retrieval events per window, which the copying
//               circuit forms from fastest (a prompt has one)
//   repeat      BOS + a span of haystack text + the same span again: every token of the
//               second copy is predictable by copying (the induction pattern retrieval is
//               built on, at every distance up to half the prompt)
// filler = BOS + haystack text, so the prompt (which starts with its own BOS) ends exactly at
// the document's end; the prompt's length P is drawn in [prompt_min * length, length]
// (prompt_min 1: every prompt fills its document). Document i is a pure function of (seed, i).
//
// Packed windows (prompt_max > 0), for extension stages that train on long natural text and
// keep retrieval only at short range: a document is one run of the text source (the `text`
// tokens, else the haystack) from a random point, read on across the whole window, with whole
// prompts of at most prompt_max tokens (lengths in [prompt_min * prompt_max, prompt_max])
// put in at random points; each text piece after a cut starts with BOS. The mix's weights are
// then token shares: `text=2,needle=1,passkey=1` gives half the window's tokens (in
// expectation) to text, a third to needle prompts, a sixth to pass keys, within a limit: each
// city's needle and each synthetic task at most once per window (the rest goes to text). So
// no prompt is longer than prompt_max: a model trained on these windows never retrieved from
// further away.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eval/retrieval.h"

namespace easyctx::eval {

enum class DocKind { Text, Needle, Passkey, MultiKey, MultiValue, VariableTracking, KeyValue, Repeat };
const char* doc_kind_name(DocKind k);  // "text", "needle", "passkey", "multikey", "multivalue", "vt", "kv", "repeat"

struct SynthOptions {
  int64_t length = 2048;      // tokens per document (= the stage's data.seq_length)
  double prompt_min = 0.125;  // a prompt's length is drawn in [prompt_min * length, length]
  std::map<DocKind, double> mix{
      {DocKind::Needle, 1}, {DocKind::Passkey, 1}, {DocKind::KeyValue, 1}, {DocKind::Text, 1}};  // relative weights
  int kv_pairs = 0;        // kv: pairs per document (0: about length / 48)
  int64_t prompt_max = 0;  // > 0: packed windows (above), no prompt longer than this
  uint64_t seed = 1;
  TaskOptions task;  // digits, keys, values, hops (the eval's flags)
};
// Parses "needle=1,passkey=1,kv=2,text=0.5": InputError naming --mix.
std::map<DocKind, double> parse_mix(const std::string& s);
void check_synth_options(const SynthOptions& o);  // InputError naming the flag

// What documents hold, summed over those built (h5synth.json reports it).
struct DocTally {
  std::map<DocKind, int64_t> tokens;   // by kind; text pieces (their BOS included) under Text
  std::map<DocKind, int64_t> prompts;  // whole prompts by kind
  int64_t shortest_prompt = 0, longest_prompt = 0;
  void add_prompt(DocKind kind, int64_t n);
  void add(const DocTally& o);
};

// Builds documents over a text haystack (eval::load_haystack's tokens, BOS/EOS removed).
class SynthDocs {
 public:
  // `text`: the packed windows' text source (empty: the haystack).
  SynthDocs(const data::Tokenizer& tok, SynthOptions o, std::vector<uint32_t> haystack,
            std::vector<uint32_t> text = {});
  // Document i (exactly o.length ids) and its kind (packed windows: Text); adds what it holds
  // to *tally.
  std::vector<uint32_t> document(uint64_t i, DocKind* kind = nullptr, DocTally* tally = nullptr) const;
  // Prompt tokens beyond the haystack's L for the eval's task t (the Singapore needle, the
  // synthetic tasks): an eval context of L tokens gives prompts of L + overhead(t) tokens.
  int64_t overhead(Task t) const;
  const SynthOptions& options() const { return o_; }

 private:
  std::vector<uint32_t> key_value(uint64_t seed, int64_t n) const;
  std::vector<uint32_t> packed_document(uint64_t i, DocTally* tally) const;
  // Exactly P ids; a needle's city is `city_index` (into cities_) when >= 0, else drawn.
  std::vector<uint32_t> prompt(DocKind kind, int64_t P, Rng& rng, int64_t city_index = -1) const;
  int64_t min_prompt(DocKind kind) const;
  static DocKind draw_kind(Rng& rng, const std::vector<std::pair<DocKind, double>>& cdf);
  const PromptBuilder& builder_for_city(size_t c) const { return *cities_.at(c); }
  const data::Tokenizer& tok_;
  SynthOptions o_;
  std::vector<uint32_t> hay_, text_, noise_;
  std::vector<std::unique_ptr<PromptBuilder>> cities_;        // [0]: Singapore (the eval's)
  std::vector<std::pair<DocKind, double>> cdf_, prompt_cdf_;  // document kinds; packed: prompt kinds
  double prompt_share_ = 0;                                   // packed: the prompts' token share
  std::vector<int64_t> overhead_;                             // by Task
};

}  // namespace easyctx::eval
