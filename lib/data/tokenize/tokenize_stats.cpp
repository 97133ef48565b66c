// TokenizeStats (h5tokenize_run.h): the counts of an h5tokenize run, their JSON form (the
// summary file, the exchange between ranks, the resume cursors) and the summary text.
#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/tokenize/h5tokenize_run.h"

namespace easyctx::data {

namespace {
bool earlier(const TokenizeStats::Skips& a, const TokenizeStats::Skips& b) {
  return a.unit != b.unit ? a.unit < b.unit : a.line < b.line;
}

// Keeps the kMaxSkipFiles files whose first skip comes first; the rest are counted.
void cap_skip_files(TokenizeStats& s) {
  while (s.skipped_files.size() > TokenizeStats::kMaxSkipFiles) {
    auto last = s.skipped_files.begin();
    for (auto it = s.skipped_files.begin(); it != s.skipped_files.end(); ++it)
      if (earlier(last->second, it->second)) last = it;
    ++s.other_skip_files;
    s.other_skips += last->second.count;
    s.skipped_files.erase(last);
  }
}

// The counters by their JSON key, in the summary file's order: add(), to_json() and merge_json()
// all go through this one list, so that a new counter cannot be summed but not saved.
const std::pair<const char*, uint64_t TokenizeStats::*> kCounters[] = {
    {"records", &TokenizeStats::records},
    {"blank", &TokenizeStats::blank},
    {"malformed", &TokenizeStats::malformed},
    {"empty", &TokenizeStats::empty},
    {"dropped_short", &TokenizeStats::dropped_short},
    {"dropped_full", &TokenizeStats::dropped_full},
    {"byte_order_marks", &TokenizeStats::boms},
    {"forced_cuts", &TokenizeStats::forced_cuts},
    {"other_skip_files", &TokenizeStats::other_skip_files},
    {"other_skips", &TokenizeStats::other_skips},
    {"bytes", &TokenizeStats::bytes},
    {"units", &TokenizeStats::units},
    {"units_skipped", &TokenizeStats::units_skipped},
    {"shards", &TokenizeStats::shards},
    {"shards_written", &TokenizeStats::shards_written}};

void add_skips(TokenizeStats& s, const std::string& file, const TokenizeStats::Skips& k) {
  auto [it, fresh] = s.skipped_files.emplace(file, k);
  if (!fresh) {
    const uint64_t n = it->second.count + k.count;
    if (earlier(k, it->second)) it->second = k;
    it->second.count = n;
  }
  cap_skip_files(s);
}
}  // namespace

void TokenizeStats::skip(const std::string& file, uint64_t unit, uint64_t line, const std::string& why) {
  ++malformed;
  add_skips(*this, file, Skips{1, unit, line, why.size() > 300 ? why.substr(0, 300) + "..." : why});
}

void TokenizeStats::add(const TokenizeStats& o) {
  for (const auto& [name, s] : o.sources) {
    sources[name].docs += s.docs;
    sources[name].tokens += s.tokens;
  }
  for (int b = 0; b < kHistBuckets; ++b) hist[b] += o.hist[b];
  for (const auto& [key, m] : kCounters) this->*m += o.*m;
  for (const auto& [file, k] : o.skipped_files) add_skips(*this, file, k);  // adds to other_skip* beyond the cap
}

uint64_t TokenizeStats::total_docs() const {
  uint64_t n = 0;
  for (const auto& kv : sources) n += kv.second.docs;
  return n;
}
uint64_t TokenizeStats::total_tokens() const {
  uint64_t n = 0;
  for (const auto& kv : sources) n += kv.second.tokens;
  return n;
}

std::string TokenizeStats::to_json() const {
  Json src = Json::object();
  for (const auto& [name, s] : sources) src.set(name, Json::object({{"docs", s.docs}, {"tokens", s.tokens}}));
  Json h = Json::array();
  for (uint64_t v : hist) h.push_back(v);
  Json files = Json::object();
  for (const auto& [f, k] : skipped_files)
    files.set(f, Json::object({{"count", k.count}, {"unit", k.unit}, {"line", k.line}, {"why", k.why}}));
  Json j = Json::object();
  j.set("sources", src);
  j.set("length_histogram", h);
  for (const auto& [key, m] : kCounters) j.set(key, this->*m);
  j.set("skipped_files", files);
  j.set("docs", total_docs());
  j.set("tokens", total_tokens());
  j.set("seconds", seconds);
  return j.dump();
}

void TokenizeStats::merge_json(const std::string& text) {
  const Json j = parse_json(text, "h5tokenize stats");
  TokenizeStats o;
  for (const auto& [name, s] : j.at("sources").as_object()) {
    o.sources[name].docs = static_cast<uint64_t>(s.at("docs").as_int());
    o.sources[name].tokens = static_cast<uint64_t>(s.at("tokens").as_int());
  }
  for (int b = 0; b < kHistBuckets; ++b) o.hist[b] = static_cast<uint64_t>(j.at("length_histogram")[b].as_int());
  // Absent keys (a cursor written by an older build) count 0.
  const auto n = [&](const char* key) {
    const Json* v = j.find(key);
    return v ? static_cast<uint64_t>(v->as_int()) : uint64_t(0);
  };
  for (const auto& [key, m] : kCounters) o.*m = n(key);
  if (const Json* f = j.find("skipped_files"))
    for (const auto& [file, k] : f->as_object())
      o.skipped_files[file] =
          Skips{static_cast<uint64_t>(k.at("count").as_int()), static_cast<uint64_t>(k.at("unit").as_int()),
                static_cast<uint64_t>(k.at("line").as_int()), k.at("why").as_string()};
  add(o);
}

std::string TokenizeStats::format() const {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "%-28s %12s %15s %10s\n", "source", "documents", "tokens", "tok/doc");
  s += line;
  for (const auto& [name, v] : sources) {
    std::snprintf(line, sizeof line, "%-28s %12llu %15llu %10.1f\n", name.c_str(), (unsigned long long)v.docs,
                  (unsigned long long)v.tokens, v.docs ? double(v.tokens) / v.docs : 0.0);
    s += line;
  }
  std::snprintf(line, sizeof line, "%-28s %12llu %15llu\n", "total", (unsigned long long)total_docs(),
                (unsigned long long)total_tokens());
  s += line;
  s += "document length (tokens):";
  const char* labels[kHistBuckets] = {"<128", "128-511", "512-2K", "2K-8K", "8K-32K", "32K-128K", ">=128K"};
  for (int b = 0; b < kHistBuckets; ++b) s += std::string("  ") + labels[b] + ": " + std::to_string(hist[b]);
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::snprintf(line, sizeof line,
                "\nrecords %llu, skipped: malformed %llu, empty %llu; upsampling dropped: short %llu, "
                "source full %llu; blank lines %llu, byte-order marks removed %llu, records cut inside a word %llu\n",
                u(records), u(malformed), u(empty), u(dropped_short), u(dropped_full), u(blank), u(boms),
                u(forced_cuts));
  s += line;
  std::snprintf(line, sizeof line,
                "units %llu done + %llu already finished, %llu shards (%llu written now), %.1f s, %.2fM tokens/s "
                "(the counts are of the whole output)\n",
                u(units), u(units_skipped), u(shards), u(shards_written), seconds,
                seconds > 0 ? total_tokens() / seconds / 1e6 : 0.0);
  s += line;
  return s;
}

std::string TokenizeStats::skipped_error(double fraction) const {
  if (malformed == 0 || double(malformed) <= fraction * double(records)) return "";
  std::vector<std::pair<std::string, Skips>> files(skipped_files.begin(), skipped_files.end());
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return earlier(a.second, b.second); });
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f%%", records ? 100.0 * double(malformed) / double(records) : 100.0);
  std::string s = detail::concat(malformed, " of ", records, " records (", pct,
                                 ") were skipped as malformed, more than --max-skipped-fraction ", fraction,
                                 " allows. By file (first skipped record and why):");
  for (const auto& [f, k] : files)
    s += detail::concat("\n  ", f, ": ", k.count, " skipped, first ", f, ":", k.line, ": ", k.why);
  if (other_skip_files) s += detail::concat("\n  and ", other_skips, " in ", other_skip_files, " more file(s)");
  return s +
         "\nThe shards written are complete and valid (h5tokenize_summary.json counts them). Check the input (a "
         "wrong --format, --text-field or --chat-template skips every record), or pass --max-skipped-fraction "
         "with a larger share to accept these skips: a rerun then finishes without tokenizing again.";
}

}  // namespace easyctx::data
