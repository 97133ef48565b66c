#include "eval/recall_docs.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>

#include "core/error.h"

namespace easyctx::eval {
namespace {

constexpr const char* kEpisodeNames[] = {"fact", "passkey", "list", "chain"};

// Attributes: an optional adjective and a noun. Never "special" or "magic": the needle
// evaluation's attribute is "special magic ... number", which no training text holds.
const char* const kAttrAdj[] = {"secret",  "hidden",   "lucky",     "private",  "chosen",     "personal", "official",
                                "true",    "final",    "sacred",    "golden",   "silent",     "ancient",  "mystery",
                                "unique",  "reserved", "winning",   "assigned", "registered", "master",   "backup",
                                "current", "original", "emergency", "daily",    "favourite",  "old",      "new"};
const char* const kAttrNoun[] = {"number",       "code",          "key",
                                 "word",         "value",         "figure",
                                 "password",     "PIN",           "ID",
                                 "token",        "tag",           "label",
                                 "score",        "serial number", "account number",
                                 "room number",  "ticket number", "phone number",
                                 "code word",    "combination",   "passphrase",
                                 "index",        "locker number", "badge number",
                                 "order number", "reference"};
constexpr size_t kShortAttrNouns = 10;  // the first ten: the nouns a key can go before
// Keys: "the {adjective} {noun}", a first name, or a made-up proper name (syllables).
const char* const kKeyAdj[] = {"red",   "blue",     "green",    "yellow",  "purple",  "orange", "grey",  "black",
                               "white", "silver",   "brown",    "tall",    "small",   "old",    "young", "quiet",
                               "loud",  "northern", "southern", "eastern", "western", "little", "great", "wooden",
                               "iron",  "stone",    "glass",    "paper",   "velvet",  "copper"};
const char* const kKeyNoun[] = {"fox",     "owl",        "river",   "tower",  "lantern", "garden", "violin",  "kettle",
                                "falcon",  "harbor",     "meadow",  "ship",   "bridge",  "castle", "mill",    "chapel",
                                "forest",  "island",     "valley",  "engine", "clock",   "mirror", "drum",    "wagon",
                                "barn",    "lighthouse", "orchard", "cellar", "station", "market", "library", "museum",
                                "theatre", "bakery",     "farm",    "school", "hotel",   "office", "company", "team",
                                "village", "club",       "guild",   "camel",  "badger",  "heron",  "otter",   "piano"};
const char* const kNames[] = {"Alice",  "Bruno", "Clara", "Dmitri",  "Elena",   "Farid", "Greta",  "Hugo",
                              "Ines",   "Jonas", "Keiko", "Liam",    "Maya",    "Nils",  "Olga",   "Pablo",
                              "Quinn",  "Rosa",  "Sven",  "Tara",    "Umar",    "Vera",  "Wendel", "Xenia",
                              "Yusuf",  "Zora",  "Amos",  "Bettina", "Cyrus",   "Delia", "Emil",   "Fiona",
                              "Gideon", "Hana",  "Ivo",   "Judith",  "Kasimir", "Lotte", "Matteo", "Nadia"};
const char* const kSyllables[] = {"ka",  "lo",  "mi",  "ver", "tan", "sel", "dor", "ri",  "no",  "pa", "zu", "bel",
                                  "tro", "shi", "gal", "mar", "ven", "qua", "lis", "or",  "an",  "ek", "ul", "fen",
                                  "dra", "mos", "thi", "ro",  "sa",  "ny",  "vo",  "kel", "dun", "ba"};
const char* const kValueWords[] = {
    "apple",   "copper", "violet",  "harbor", "thunder",  "marble", "pepper", "saffron", "walnut",  "crimson",
    "glacier", "meadow", "lantern", "falcon", "orchid",   "quartz", "cobalt", "ember",   "juniper", "maple",
    "nectar",  "onyx",   "pebble",  "raven",  "sapphire", "tulip",  "velvet", "willow",  "zephyr",  "amber",
    "basil",   "cedar",  "dune",    "fjord",  "garnet",   "hazel",  "indigo", "jasmine", "kelp",    "lilac"};
// Pass keys: the statement, the question, the answer's lead.
const char* const kPassKeys[][3] = {
    {"The pass key is {V}. Remember it. {V} is the pass key.", "What is the pass key?", "The pass key is"},
    {"The password is {V}. Do not forget it.", "What is the password?", "The password is"},
    {"The access code is {V}. Keep it safe.", "What is the access code?", "The access code is"},
    {"The combination of the safe is {V}.", "What is the combination of the safe?", "The combination of the safe is"},
    {"The door code is {V}. Remember it.", "What is the door code?", "The door code is"}};
const char* const kListHeaders[] = {"Records:", "Inventory:", "Register entries:", "Table of values:", "Log:"};
const char* const kListSeps[][2] = {{": ", ":"}, {" = ", " ="}, {" -> ", " ->"}};
const char* const kFactPrefixes[] = {
    "", "", "", "", "Remember this: ", "Note: ", "For the record, ", "Keep in mind that "};
const char* const kQuestionFramings[] = {
    "", "", "", "Answer from the text. ", "Look back at the text. ", "One question. "};

template <size_t N>
const char* pick(Rng& rng, const char* const (&a)[N]) {
  return a[rng.below(N)];
}
std::string cap(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}
std::string proper_name(Rng& rng) {
  std::string s;
  for (uint64_t n = 2 + rng.below(2), i = 0; i < n; ++i) s += pick(rng, kSyllables);
  return cap(s);
}
std::string code_value(Rng& rng) {
  const char* alnum = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789";
  std::string s;
  const uint64_t n = 4 + rng.below(4), dash = rng.below(2) ? n / 2 : 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (dash && i == dash) s += '-';
    s += alnum[rng.below(34)];
  }
  return s;
}
// A value: a number of 2-10 digits (6 in 10), a word (2 in 10) or a letter-digit code.
std::string any_value(Rng& rng) {
  const uint64_t u = rng.below(10);
  if (u < 6) return std::to_string(random_number(rng, 2 + static_cast<int>(rng.below(9))));
  return u < 8 ? std::string(pick(rng, kValueWords)) : code_value(rng);
}
// Draws with `draw` until the result is not in `used` (then adds it).
template <typename F>
std::string fresh(std::set<std::string>& used, Rng& rng, F draw) {
  for (int tries = 0;; ++tries) {
    std::string s = draw(rng);
    if (used.insert(s).second) return s;
    EASYCTX_CHECK(tries < 1000, "h5recall: no fresh key or value after 1000 draws (last: ", s, ")");
  }
}
// A question over subject phrase `subj` whose verbatim answer lead is `lead`.
std::string fact_question(Rng& rng, const std::string& subj, const std::string& lead) {
  switch (rng.below(10)) {
    case 0:
    case 1:
    case 2: return "Question: What is " + subj + "? Answer: " + lead;
    case 3:
    case 4: return "Q: What is " + subj + "? A: " + lead;
    case 5:
    case 6: return "What is " + subj + "? " + lead;
    case 7: return "Do you remember " + subj + "? " + lead;
    case 8: return "What was " + subj + "? It was";
    default: return "Recall " + subj + ". Answer:";
  }
}

Episode fact(Rng& rng, std::set<std::string>& used) {
  std::string bare;  // the key as it can stand inside an attribute ("the lucky Tandor number")
  const std::string key = fresh(used, rng, [&](Rng& r) {
    switch (r.below(3)) {
      case 0: {
        const std::string adj = pick(r, kKeyAdj), noun = pick(r, kKeyNoun);
        bare = adj + " " + noun;
        return "the " + bare;
      }
      case 1: return bare = pick(r, kNames);
      default: return bare = proper_name(r);
    }
  });
  const std::string value = fresh(used, rng, any_value);
  const std::string attr = (rng.below(10) < 7 ? std::string(pick(rng, kAttrAdj)) + " " : "") + pick(rng, kAttrNoun);
  std::string subj;
  switch (rng.below(4)) {
    case 0: subj = "the " + attr + " of " + key; break;
    case 1: subj = "the " + attr + " for " + key; break;
    case 2: subj = key + "'s " + attr; break;
    default: {
      std::string adjs = pick(rng, kAttrAdj);
      if (rng.below(2)) adjs += std::string(" ") + pick(rng, kAttrAdj);
      subj = "the " + adjs + " " + bare + " " + kAttrNoun[rng.below(kShortAttrNouns)];
    }
  }
  const std::string link = rng.below(2) ? " is:" : " is";
  const std::string prefix = pick(rng, kFactPrefixes);
  Episode e;
  e.kind = EpisodeKind::Fact;
  e.statements.push_back(cap(prefix + subj) + link + " " + value + ".");
  e.question = fact_question(rng, subj, cap(subj) + link);
  e.answer = value;
  return e;
}

Episode pass_key(Rng& rng, std::set<std::string>& used) {
  const auto& v = kPassKeys[rng.below(sizeof(kPassKeys) / sizeof(kPassKeys[0]))];
  const std::string value = fresh(used, rng, any_value);
  Episode e;
  e.kind = EpisodeKind::PassKey;
  e.statements.push_back(replace_all(v[0], "{V}", value));
  e.question = rng.below(2) ? std::string("Question: ") + v[1] + " Answer: " + v[2] : std::string(v[1]) + " " + v[2];
  e.answer = value;
  return e;
}

Episode list(Rng& rng, std::set<std::string>& used) {
  const uint64_t n = 3 + rng.below(10), id_form = rng.below(3), sep = rng.below(3);
  const int digits = 3 + static_cast<int>(rng.below(6));
  const bool codes = rng.below(4) == 0;
  std::vector<std::string> ids, values;
  for (uint64_t i = 0; i < n; ++i) {
    ids.push_back(fresh(used, rng, [&](Rng& r) {
      if (id_form == 0) return "ID-" + std::to_string(random_number(r, 4));
      if (id_form == 1) return code_value(r).substr(0, 3) + "-" + std::to_string(random_number(r, 3));
      return "#" + std::to_string(random_number(r, 5));
    }));
    values.push_back(
        fresh(used, rng, [&](Rng& r) { return codes ? code_value(r) : std::to_string(random_number(r, digits)); }));
  }
  std::string block = pick(rng, kListHeaders);
  for (uint64_t i = 0; i < n; ++i) block += "\n" + ids[i] + kListSeps[sep][0] + values[i];
  const uint64_t k = rng.below(n);
  const std::string lead = ids[k] + kListSeps[sep][1];
  Episode e;
  e.kind = EpisodeKind::List;
  e.statements.push_back(block);
  switch (rng.below(3)) {
    case 0: e.question = "Question: What is the entry for " + ids[k] + "? Answer: " + lead; break;
    case 1: e.question = "Look up " + ids[k] + ". " + lead; break;
    default: e.question = "What is listed for " + ids[k] + "? " + lead;
  }
  e.answer = values[k];
  return e;
}

Episode chain(Rng& rng, std::set<std::string>& used) {
  const bool vars = rng.below(2) == 0;  // RULER's "VAR X = ..." or words
  const uint64_t hops = 1 + rng.below(2);
  std::vector<std::string> names;
  for (uint64_t i = 0; i <= hops; ++i)
    names.push_back(fresh(used, rng, [&](Rng& r) {
      if (!vars) return proper_name(r);
      std::string s = "VAR ";
      for (int c = 0; c < 5; ++c) s += static_cast<char>('A' + r.below(26));
      return s;
    }));
  const std::string value = fresh(used, rng, any_value);
  Episode e;
  e.kind = EpisodeKind::Chain;
  e.statements.push_back(vars ? names[0] + " = " + value + "." : "Let " + names[0] + " be " + value + ".");
  for (uint64_t i = 1; i <= hops; ++i)
    e.statements.push_back(vars ? names[i] + " = " + names[i - 1] + "."
                                : "Let " + names[i] + " be the same as " + names[i - 1] + ".");
  const std::string& last = names[hops];
  e.question = vars ? "Question: What value does " + last + " hold? Answer: " + last + " holds"
                    : "What is " + last + "? " + last + " is";
  e.answer = value;
  return e;
}

}  // namespace

const char* episode_kind_name(EpisodeKind k) { return kEpisodeNames[static_cast<int>(k)]; }

std::map<EpisodeKind, double> parse_episode_mix(const std::string& s) {
  std::map<EpisodeKind, double> m;
  for (const auto& kv : parse_mix_weights(s, {std::begin(kEpisodeNames), std::end(kEpisodeNames)}, "episode kind"))
    m[static_cast<EpisodeKind>(kv.first)] = kv.second;
  return m;
}

void check_recall_options(const RecallOptions& o) {
  EASYCTX_CHECK_INPUT(o.length >= 128, "--length: ", o.length, " (must be >= 128 tokens)");
  EASYCTX_CHECK_INPUT(o.episodes >= 1 && o.episodes <= 100000, "--episodes: ", o.episodes, " (must be 1..100000)");
  EASYCTX_CHECK_INPUT(o.min_distance >= 0, "--min-distance: ", o.min_distance, " (must be >= 0)");
  EASYCTX_CHECK_INPUT(o.max_distance >= 0, "--max-distance: ", o.max_distance, " (must be >= 0; 0: the window)");
  EASYCTX_CHECK_INPUT(o.max_distance == 0 || o.min_distance <= o.max_distance, "--min-distance ", o.min_distance,
                      " is above --max-distance ", o.max_distance);
  EASYCTX_CHECK_INPUT(o.lm_share >= 0 && o.lm_share <= 1, "--lm-share: ", o.lm_share, " (must be in [0, 1])");
  double total = 0;
  for (const auto& kv : o.mix) total += kv.second;
  EASYCTX_CHECK_INPUT(total > 0, "--mix: no episode kind has a positive weight");
}

const std::vector<std::string>& forbidden_phrases() {
  static const std::vector<std::string> p{"singapore", "special magic", "story book", "content of the book"};
  return p;
}

std::string forbidden_phrase(const std::string& text) {
  std::string low;
  low.reserve(text.size());
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (low.empty() || low.back() == ' ')) continue;
    low += space ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (const std::string& p : forbidden_phrases())
    if (low.find(p) != std::string::npos) return p;
  return "";
}

Episode draw_episode(EpisodeKind k, Rng& rng, std::set<std::string>& used) {
  Episode e;
  switch (k) {
    case EpisodeKind::Fact: e = fact(rng, used); break;
    case EpisodeKind::PassKey:  // one per window: its statement has no key to tell two apart
      e = used.insert("#passkey").second ? pass_key(rng, used) : fact(rng, used);
      break;
    case EpisodeKind::List: e = list(rng, used); break;
    case EpisodeKind::Chain: e = chain(rng, used); break;
  }
  for (const std::string* t : {&e.question, &e.answer})
    EASYCTX_CHECK(forbidden_phrase(*t).empty(), "h5recall: the grammar made a forbidden phrase: ", *t);
  for (const std::string& t : e.statements)
    EASYCTX_CHECK(forbidden_phrase(t).empty(), "h5recall: the grammar made a forbidden phrase: ", t);
  return e;
}

void RecallTally::add_distance(int64_t d) {
  size_t b = 0;
  while (b + 1 < 40 && (int64_t{128} << b) <= d) ++b;
  if (distances.size() <= b) distances.resize(b + 1, 0);
  ++distances[b];
  longest_distance = std::max(longest_distance, d);
}

void RecallTally::add(const RecallTally& o) {
  windows += o.windows;
  lm_windows += o.lm_windows;
  tokens += o.tokens;
  text_tokens += o.text_tokens;
  weighted_tokens += o.weighted_tokens;
  answer_tokens += o.answer_tokens;
  for (const auto& kv : o.episodes) episodes[kv.first] += kv.second;
  if (distances.size() < o.distances.size()) distances.resize(o.distances.size(), 0);
  for (size_t b = 0; b < o.distances.size(); ++b) distances[b] += o.distances[b];
  longest_distance = std::max(longest_distance, o.longest_distance);
}

RecallDocs::RecallDocs(const data::Tokenizer& tok, RecallOptions o, std::vector<uint32_t> text)
    : tok_(tok), o_(std::move(o)), text_(std::move(text)) {
  check_recall_options(o_);
  EASYCTX_CHECK_INPUT(static_cast<int64_t>(text_.size()) >= o_.length, "--text-dir: ", text_.size(),
                      " tokens, fewer than --length ", o_.length);
  const int64_t v = tok_.vocab_size();
  sentence_end_.assign(static_cast<size_t>(v), 0);
  for (int64_t id = 0; id < v; ++id) {
    if (id == tok_.bos_id() || id == tok_.eos_id()) continue;
    const uint32_t u = static_cast<uint32_t>(id);
    const std::string s = tok_.decode(&u, 1);
    bool end = false, only = !s.empty();
    for (char c : s) {
      if (c == '.' || c == '!' || c == '?' || c == '\n') end = true;
      else if (!std::isspace(static_cast<unsigned char>(c))) only = false;
    }
    sentence_end_[static_cast<size_t>(id)] = end && only;
  }
  double total = 0, acc = 0;
  for (const auto& kv : o_.mix) total += kv.second;
  for (const auto& kv : o_.mix)
    if (kv.second > 0) cdf_.push_back({kv.first, (acc += kv.second) / total});
  cdf_.back().second = 1.0;
}

EpisodeKind RecallDocs::draw_kind(Rng& rng) const {
  const double u = rng.uniform();
  for (const auto& c : cdf_)
    if (u < c.second) return c.first;
  return cdf_.back().first;
}

std::vector<RecallDocs::Piece> RecallDocs::episode_pieces(Rng& rng, int64_t* piece_tokens) const {
  // `episodes` episodes, each drawn until one fits: their pieces fill at most half the window.
  const bool llama3 = tok_.kind() == "hf-bpe";  // its questions end with a space (as the eval's)
  std::set<std::string> used;
  std::vector<Piece> pieces;
  int64_t total = 0;
  int ep = 0;
  for (int tries = 0; ep < o_.episodes && tries < 4 * o_.episodes + 8; ++tries) {
    const Episode e = draw_episode(draw_kind(rng), rng, used);
    std::vector<Piece> add;
    for (size_t s = 0; s < e.statements.size(); ++s) {
      Piece p;
      p.order = static_cast<int>(s);
      p.first = s == 0;
      p.ids = tok_.encode((rng.below(10) < 7 ? "\n" : " ") + e.statements[s] + (rng.below(10) < 7 ? "\n" : " "));
      add.push_back(std::move(p));
    }
    Piece q;
    q.order = 100;  // after its statements at the same offset
    const std::string framing = pick(rng, kQuestionFramings);
    q.ids = tok_.encode((rng.below(10) < 7 ? "\n" : " ") + framing + e.question + (llama3 ? " " : ""));
    q.weights.assign(q.ids.size(), 0);
    const std::vector<uint32_t> answer = tok_.encode(e.answer), close = tok_.encode(rng.below(2) ? ".\n" : ". ");
    q.ids.insert(q.ids.end(), answer.begin(), answer.end());
    q.weights.insert(q.weights.end(), answer.size(), 1);
    q.ids.insert(q.ids.end(), close.begin(), close.end());
    q.weights.resize(q.ids.size(), 0);
    add.push_back(std::move(q));
    int64_t n = 0;
    for (Piece& p : add) {
      p.episode = ep;
      p.kind = e.kind;
      if (p.weights.empty()) p.weights.assign(p.ids.size(), 0);
      n += static_cast<int64_t>(p.ids.size());
    }
    if (total + n > o_.length / 2) continue;
    total += n;
    for (Piece& p : add) pieces.push_back(std::move(p));
    ++ep;
  }
  EASYCTX_CHECK_INPUT(!pieces.empty(), "--length ", o_.length, ": too short for one episode of the grammar");
  *piece_tokens = total;
  return pieces;
}

int64_t RecallDocs::after_sentence_end(const std::vector<uint32_t>& run, int64_t from, int64_t end) const {
  for (int64_t i = from; i < end; ++i)
    if (sentence_end_[run[static_cast<size_t>(i)]]) return i + 1;
  return from;  // none near: the drawn point
}

void RecallDocs::place(std::vector<Piece>& pieces, Rng& rng, const std::vector<uint32_t>& run, int64_t T) const {
  const int64_t dmax = o_.max_distance > 0 ? std::min(o_.max_distance, T) : T;
  const int64_t dmin = std::min(o_.min_distance, dmax), snap = 256;
  for (size_t i = 0; i < pieces.size();) {
    size_t j = i;
    while (j < pieces.size() && pieces[j].episode == pieces[i].episode) ++j;  // [i, j): one episode, question last
    const int64_t d =
        o_.log_distance
            ? std::min(dmax, static_cast<int64_t>(std::exp(std::log(static_cast<double>(dmin + 1)) +
                                                           rng.uniform() * (std::log(static_cast<double>(dmax + 1)) -
                                                                            std::log(static_cast<double>(dmin + 1))))) -
                                 1)
            : dmin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(dmax - dmin + 1)));
    const int64_t q = d + static_cast<int64_t>(rng.below(static_cast<uint64_t>(T - d + 1)));
    const int64_t qs = after_sentence_end(run, q, std::min(T, q + snap));
    const int64_t s = after_sentence_end(run, q - d, std::min(q, q - d + snap));
    // A chain's later statements at points between its first and its question, in order.
    std::vector<int64_t> at{s};
    for (size_t k = i + 1; k + 1 < j; ++k) {
      const int64_t p = s + static_cast<int64_t>(rng.below(static_cast<uint64_t>(q - s + 1)));
      at.push_back(after_sentence_end(run, p, std::min(q, p + snap)));
    }
    std::sort(at.begin(), at.end());
    for (size_t k = i; k + 1 < j; ++k) pieces[k].at = at[k - i];
    pieces[j - 1].at = std::max(qs, at.back());
    i = j;
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.at != b.at ? a.at < b.at : a.order != b.order ? a.order < b.order : a.episode < b.episode;
  });
}

RecallWindow RecallDocs::window(uint64_t i, RecallTally* tally) const {
  Rng rng(mix_seed({o_.seed, 0x726563616c6cull, i}));
  RecallWindow w;
  w.lm = rng.uniform() < o_.lm_share;
  int64_t P = 0;
  std::vector<Piece> pieces = episode_pieces(rng, &P);
  const int64_t bos_n = tok_.bos_id() >= 0 ? 1 : 0, S = o_.length, T = S - bos_n - P;
  const uint64_t off = rng.below(text_.size() - static_cast<uint64_t>(T) + 1);
  const std::vector<uint32_t> run(text_.begin() + static_cast<int64_t>(off),
                                  text_.begin() + static_cast<int64_t>(off) + T);
  place(pieces, rng, run, T);
  w.tokens.reserve(static_cast<size_t>(S));
  if (bos_n) w.tokens.push_back(static_cast<uint32_t>(tok_.bos_id()));
  w.weights.assign(w.tokens.size(), 0);
  std::map<int, int64_t> stated;  // episode -> where its first statement ends
  RecallTally t;
  int64_t at = 0;
  for (const Piece& p : pieces) {
    w.tokens.insert(w.tokens.end(), run.begin() + at, run.begin() + p.at);
    w.weights.resize(w.tokens.size(), w.lm ? 1 : 0);
    at = p.at;
    if (p.order == 100) {
      t.add_distance(static_cast<int64_t>(w.tokens.size()) - stated.at(p.episode));
      ++t.episodes[p.kind];
    }
    w.tokens.insert(w.tokens.end(), p.ids.begin(), p.ids.end());
    w.weights.insert(w.weights.end(), p.weights.begin(), p.weights.end());
    if (p.first) stated[p.episode] = static_cast<int64_t>(w.tokens.size());
    for (uint8_t x : p.weights) t.answer_tokens += x;
  }
  w.tokens.insert(w.tokens.end(), run.begin() + at, run.end());
  w.weights.resize(w.tokens.size(), w.lm ? 1 : 0);
  EASYCTX_CHECK(static_cast<int64_t>(w.tokens.size()) == S, "h5recall: window ", i, " has ", w.tokens.size(),
                " tokens, not ", S);
  if (tally) {
    t.windows = 1;
    t.lm_windows = w.lm ? 1 : 0;
    t.tokens = S;
    t.text_tokens = T;
    for (uint8_t x : w.weights) t.weighted_tokens += x;
    tally->add(t);
  }
  return w;
}

}  // namespace easyctx::eval
