// Per-source length upsampling (Fu et al. 2024, "Data Engineering for Scaling Language
// Models to 128K Context"; FranxYao/Long-Context-Data-Engineering slimpajama_packing.py).
//
// Every decision uses the estimated length len(text in code points) / 3.68, as the
// reference does. Modes:
//   none                      keep everything;
//   per_source                budget[s] = total_tokens * mix[s] (SlimPajama's own token
//                             shares); a document of a full source is skipped; otherwise a
//                             document shorter than `threshold` (4096) is kept with
//                             probability keep_prob (0.1); long ones are always kept;
//   global                    short documents kept with probability keep_prob, one budget
//                             of total_tokens over all sources (none if total_tokens = 0);
//   upsample_code_arxiv_book  per_source with Github, ArXiv and Book weights set to 0.60
//                             before normalising the mix.
// Sources outside the seven SlimPajama names have no budget (never full) but their short
// documents are still downsampled.
// Differences from the reference, on purpose: the keep draw of a document is a hash of
// (seed, unit, record index), not a sequential RNG, so results do not depend on threads,
// ranks or resume points; budgets are per work unit, in proportion to the unit's share of
// the input bytes, so units are independent (the same plan gives the same shards at any
// rank count).
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace easyctx::data {

enum class UpsampleMode { None, PerSource, Global, CodeArxivBook };
UpsampleMode parse_upsample_mode(const std::string& s);
const char* upsample_mode_name(UpsampleMode m);

struct UpsampleOptions {
  UpsampleMode mode = UpsampleMode::None;
  double total_tokens = 0;        // required for per_source / upsample_code_arxiv_book
  double threshold = 4096;        // estimated tokens below which a document is "short"
  double keep_prob = 0.1;         // keep probability of short documents
  double chars_per_token = 3.68;  // LLAMA_CHAR_TO_TOKEN_RATIO
  uint64_t seed = 15213;
};

// The SlimPajama mix used for budgets in mode m (empty for none/global).
std::map<std::string, double> upsample_mix(UpsampleMode m);

class Upsampler {
 public:
  enum class Decision { Keep, DropShort, DropFull };
  // unit_share: this unit's fraction of all input bytes (its part of the budgets).
  Upsampler(const UpsampleOptions& opts, uint64_t unit_index, double unit_share);
  Decision decide(const std::string& source, uint64_t text_codepoints, uint64_t record_index);
  // Adds a kept document's estimated tokens to its source's counter.
  void count(const std::string& source, double est_tokens);
  double estimate(uint64_t text_codepoints) const { return double(text_codepoints) / opts_.chars_per_token; }
  // True when every budgeted source is full (reading the unit can stop).
  bool all_full() const;
  std::string state_json() const;  // counters, for the resume cursor
  void restore(const std::string& json);

 private:
  UpsampleOptions opts_;
  uint64_t unit_;
  std::map<std::string, double> budget_, used_;
  double global_budget_ = 0, global_used_ = 0;
};

}  // namespace easyctx::data
