#include "data/tokenize/upsample.h"

#include "core/error.h"
#include "core/json.h"
#include "data/sampler.h"

namespace easyctx::data {

UpsampleMode parse_upsample_mode(const std::string& s) {
  if (s == "none") return UpsampleMode::None;
  if (s == "per_source") return UpsampleMode::PerSource;
  if (s == "global") return UpsampleMode::Global;
  if (s == "upsample_code_arxiv_book") return UpsampleMode::CodeArxivBook;
  EASYCTX_THROW_INPUT("--upsample ", s, ": expected none, per_source, global or upsample_code_arxiv_book");
}

const char* upsample_mode_name(UpsampleMode m) {
  switch (m) {
    case UpsampleMode::None: return "none";
    case UpsampleMode::PerSource: return "per_source";
    case UpsampleMode::Global: return "global";
    case UpsampleMode::CodeArxivBook: return "upsample_code_arxiv_book";
  }
  return "?";
}

std::map<std::string, double> upsample_mix(UpsampleMode m) {
  // SLIMPAJAMA_ORIGINAL_MIX of the reference code (SlimPajama's token shares).
  std::map<std::string, double> mix = {
      {"RedPajamaC4", 0.26609933},        {"RedPajamaCommonCrawl", 0.53374772}, {"RedPajamaStackExchange", 0.03169647},
      {"RedPajamaWikipedia", 0.03402128}, {"RedPajamaGithub", 0.05004782},      {"RedPajamaArXiv", 0.04290379},
      {"RedPajamaBook", 0.0414836}};
  if (m == UpsampleMode::None || m == UpsampleMode::Global) return {};
  if (m == UpsampleMode::CodeArxivBook) {
    mix["RedPajamaGithub"] = mix["RedPajamaArXiv"] = mix["RedPajamaBook"] = 0.60;
    double sum = 0;
    for (auto& kv : mix) sum += kv.second;
    for (auto& kv : mix) kv.second /= sum;
  }
  return mix;
}

Upsampler::Upsampler(const UpsampleOptions& opts, uint64_t unit_index, double unit_share)
    : opts_(opts), unit_(unit_index) {
  if (opts.mode == UpsampleMode::PerSource || opts.mode == UpsampleMode::CodeArxivBook) {
    EASYCTX_CHECK_INPUT(opts.total_tokens > 0, "--upsample ", upsample_mode_name(opts.mode),
                        " needs --total-tokens > 0 (the per-source budgets are shares of it)");
    for (const auto& [s, w] : upsample_mix(opts.mode)) budget_[s] = opts.total_tokens * w * unit_share;
  }
  global_budget_ = opts.total_tokens * unit_share;
  EASYCTX_CHECK_INPUT(opts.keep_prob >= 0 && opts.keep_prob <= 1, "--keep-prob must be in [0, 1]");
  EASYCTX_CHECK_INPUT(opts.chars_per_token > 0, "--chars-per-token must be > 0");
}

Upsampler::Decision Upsampler::decide(const std::string& source, uint64_t cps, uint64_t record_index) {
  if (opts_.mode == UpsampleMode::None) return Decision::Keep;
  auto b = budget_.find(source);
  if (b != budget_.end() && used_[source] > b->second) return Decision::DropFull;
  if (opts_.mode == UpsampleMode::Global && global_budget_ > 0 && global_used_ > global_budget_)
    return Decision::DropFull;
  if (estimate(cps) < opts_.threshold) {
    uint64_t h = mix64(opts_.seed ^ mix64((unit_ << 40) ^ record_index));
    double u = double(h >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    if (u >= opts_.keep_prob) return Decision::DropShort;
  }
  return Decision::Keep;
}

void Upsampler::count(const std::string& source, double est_tokens) {
  used_[source] += est_tokens;
  global_used_ += est_tokens;
}

bool Upsampler::all_full() const {
  if (opts_.mode == UpsampleMode::Global) return global_budget_ > 0 && global_used_ > global_budget_;
  if (budget_.empty()) return false;
  for (const auto& [s, b] : budget_) {
    auto u = used_.find(s);
    if (u == used_.end() || u->second <= b) return false;
  }
  return true;
}

std::string Upsampler::state_json() const {
  Json used = Json::object();
  for (const auto& [s, v] : used_) used.set(s, v);
  Json j = Json::object();
  j.set("used", used);
  j.set("global_used", global_used_);
  return j.dump();
}

void Upsampler::restore(const std::string& text) {
  Json j = parse_json(text, "upsampler state");
  used_.clear();
  for (const auto& [s, v] : j.at("used").as_object()) used_[s] = v.as_double();
  global_used_ = j.at("global_used").as_double();
}

}  // namespace easyctx::data
