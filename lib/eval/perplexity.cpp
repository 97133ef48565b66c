#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "core/tensorboard.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "dist/comm_mpi.h"
#include "eval/model_source.h"

namespace easyctx::eval {
namespace {

struct DocRef {
  size_t file = 0;
  uint64_t offset = 0;  // in its shard
  uint64_t length = 0;
};

constexpr int64_t kMaxLength = int64_t{1} << 30;   // as data.seq_length
constexpr int64_t kMaxLengths = int64_t{1} << 20;  // rows of the sweep

void check_options(const PplOptions& o) {
  EASYCTX_CHECK_INPUT(!o.tokenized.empty(), "--tokenized: required (h5tokenize shards)");
  EASYCTX_CHECK_INPUT(o.min_tokens >= 2, "--min-tokens: ", o.min_tokens,
                      " (must be >= 2: one prediction needs 2 tokens)");
  EASYCTX_CHECK_INPUT(o.max_tokens >= o.min_tokens, "--max-tokens: ", o.max_tokens, " is below --min-tokens ",
                      o.min_tokens);
  EASYCTX_CHECK_INPUT(o.tokens_step >= 0, "--tokens-step: ", o.tokens_step, " (must be > 0; not given: doubling)");
  EASYCTX_CHECK_INPUT(o.dataset_min_tokens >= -1, "--dataset-min-tokens: ", o.dataset_min_tokens, " (must be >= 0)");
  EASYCTX_CHECK_INPUT(o.sliding_window >= 0, "--sliding-window: ", o.sliding_window, " (must be > 0)");
  EASYCTX_CHECK_INPUT(!(o.truncate && o.sliding_window > 0), "--sliding-window: ", o.sliding_window,
                      " with --truncate (one window per document; EasyContext ignores the stride then): give one");
  EASYCTX_CHECK_INPUT(o.samples == -1 || o.samples > 0, "--samples: ", o.samples, " (must be > 0)");
  EASYCTX_CHECK_INPUT(o.mlp_tile >= 0, "--mlp-tile: ", o.mlp_tile, " (must be >= 0; 0: untiled)");
  EASYCTX_CHECK_INPUT(o.lm_head_tile > 0, "--lm-head-tile: ", o.lm_head_tile, " (must be > 0)");
  EASYCTX_CHECK_INPUT(o.max_tokens <= kMaxLength, "--max-tokens: ", o.max_tokens, " is above ", kMaxLength,
                      " (positions are int32)");
  const int64_t count = o.tokens_step > 0 ? (o.max_tokens - o.min_tokens) / o.tokens_step + 1 : 1;
  EASYCTX_CHECK_INPUT(count <= kMaxLengths, "--tokens-step: ", o.tokens_step, " gives ", count, " lengths from ",
                      o.min_tokens, " to ", o.max_tokens, ", more than ", kMaxLengths, "; take a larger step");
}

std::vector<std::string> shard_files(const std::vector<std::string>& specs) {
  std::vector<std::string> files;
  for (const std::string& s : specs)
    for (const std::string& f : data::TokenDataset::resolve(s)) files.push_back(f);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

// The documents and the lengths each is scored at, as requests of the session.
struct Sweep {
  std::vector<int64_t> lengths;
  std::vector<ScoreRequest> requests;
  std::vector<std::vector<size_t>> at;  // per request: the length index of each of its spans
  std::vector<std::string> what;        // per request: "document D of FILE", for messages
  std::vector<int64_t> documents;       // per length: documents scored
  std::string summary;                  // which documents and windows ("name: value" lines)
  int64_t tokens = 0;                   // tokens of all requests
};

// The documents of at least --dataset-min-tokens tokens (`qualifying` counts them), the first
// --samples of them taken.
std::vector<size_t> choose_documents(const PplOptions& o, const std::vector<DocRef>& docs, int64_t min_len,
                                     int64_t& qualifying) {
  std::vector<size_t> chosen;
  qualifying = 0;
  for (size_t d = 0; d < docs.size(); ++d)
    if (static_cast<int64_t>(docs[d].length) >= min_len) {
      ++qualifying;
      if (o.samples < 0 || static_cast<int64_t>(chosen.size()) < o.samples) chosen.push_back(d);
    }
  EASYCTX_CHECK_INPUT(!chosen.empty(), "--dataset-min-tokens: no document of ", o.tokenized.front(),
                      o.tokenized.size() > 1 ? " (or the other --tokenized inputs)" : "", " has ", min_len, " tokens");
  return chosen;
}

// A document after its BOS: what EasyContext's windows slice; every id checked against the vocabulary.
std::vector<int32_t> document_text(const std::vector<uint32_t>& raw, int64_t vocab, int64_t bos,
                                   const std::string& file, const std::string& first_model) {
  std::vector<int32_t> text;
  text.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    EASYCTX_CHECK_INPUT(raw[i] < static_cast<uint64_t>(vocab), file, ": token id ", raw[i],
                        " >= the model's vocab_size ", vocab, " (", first_model, ")");
    if (i == 0 && static_cast<int64_t>(raw[i]) == bos) continue;
    text.push_back(static_cast<int32_t>(raw[i]));
  }
  return text;
}

// Makes a window of a document into a request (BOS first), counting the tokens of all of them:
// every window is held until scored.
struct WindowMaker {
  static constexpr int64_t kMaxWindowTokens = int64_t{1} << 31;
  int64_t bos = 0, stride = 0;
  int64_t tokens = 0;
  ScoreRequest operator()(const std::vector<int32_t>& text, int64_t begin, int64_t end) {
    ScoreRequest r;
    r.tokens.reserve(static_cast<size_t>(end - begin + 1));
    r.tokens.push_back(static_cast<int32_t>(bos));
    r.tokens.insert(r.tokens.end(), text.begin() + begin, text.begin() + end);
    tokens += end - begin + 1;
    EASYCTX_CHECK_INPUT(tokens <= kMaxWindowTokens, "--sliding-window: ", stride, " gives more than ", kMaxWindowTokens,
                        " tokens of windows over the documents and lengths; take --truncate, "
                        "a larger --sliding-window or fewer --samples");
    return r;
  }
};

// --truncate: one request per document, its window at the largest length; every length a prefix span.
void add_truncated_window(Sweep& s, const std::vector<int32_t>& text, const std::string& what, WindowMaker& window) {
  const int64_t n = static_cast<int64_t>(text.size());
  const int64_t longest = std::min(s.lengths.back() - 1, n);
  ScoreRequest r = window(text, 0, longest);
  std::vector<size_t> at;
  for (size_t i = 0; i < s.lengths.size(); ++i) {
    r.spans.push_back({0, std::min(s.lengths[i] - 1, n)});
    at.push_back(i);
  }
  s.requests.push_back(std::move(r));
  s.at.push_back(std::move(at));
  s.what.push_back(what);
}

// Sliding windows: at every length, a window every `stride` tokens, scoring the tokens it adds.
void add_sliding_windows(Sweep& s, const std::vector<int32_t>& text, const std::string& what, WindowMaker& window) {
  const int64_t n = static_cast<int64_t>(text.size());
  for (size_t i = 0; i < s.lengths.size(); ++i) {
    const int64_t max_len = s.lengths[i] - 1;
    int64_t prev_end = 0;
    for (int64_t begin = 0; begin < n; begin += window.stride) {
      const int64_t end = std::min(begin + max_len, n);
      // The tokens this window adds; a stride longer than the window scores all of it.
      const int64_t trg = std::min(end - prev_end, end - begin);
      ScoreRequest r = window(text, begin, end);
      r.spans.push_back({end - begin - trg, trg});
      s.requests.push_back(std::move(r));
      s.at.push_back({i});
      s.what.push_back(what + " (window at token " + std::to_string(begin) + ")");
      prev_end = end;
      if (end == n) break;
    }
  }
}

// EasyContext's fixed documents and their windows (perplexity.h).
Sweep build_easycontext_sweep(const PplOptions& o, int64_t vocab, int64_t bos, const std::string& first_model,
                              const std::vector<std::string>& files, std::vector<data::TokenShardReader>& shards,
                              const std::vector<DocRef>& docs, Sweep s) {
  const int64_t min_len = std::max<int64_t>(o.dataset_min_tokens, 0);
  int64_t qualifying = 0;
  const std::vector<size_t> chosen = choose_documents(o, docs, min_len, qualifying);
  std::vector<size_t> first_doc(files.size(), 0);
  for (size_t d = docs.size(); d-- > 0;) first_doc[docs[d].file] = d;
  const int64_t stride = o.sliding_window > 0 ? o.sliding_window : 256;  // EasyContext's default
  WindowMaker window{bos, stride};
  int64_t shorter = 0;
  s.documents.assign(s.lengths.size(), static_cast<int64_t>(chosen.size()));
  for (size_t d : chosen) {
    const std::string& file = files[docs[d].file];
    const std::vector<int32_t> text =
        document_text(shards[docs[d].file].read(docs[d].offset, docs[d].length), vocab, bos, file, first_model);
    const int64_t n = static_cast<int64_t>(text.size());
    const std::string what = "document " + std::to_string(d - first_doc[docs[d].file]) + " of " + file;
    EASYCTX_CHECK_INPUT(n >= 1, what, ": no token after its BOS; nothing to score");
    if (o.truncate) add_truncated_window(s, text, what, window);
    else add_sliding_windows(s, text, what, window);
    if (n < s.lengths.back() - 1) ++shorter;
  }
  const int64_t tokens = window.tokens;
  if (shorter)
    log_warn("eval ppl: ", shorter, " of the ", chosen.size(), " documents have fewer than ", s.lengths.back() - 1,
             " tokens after BOS; at the longer lengths they are scored over all their tokens (as EasyContext "
             "does)");
  s.tokens = tokens;
  s.summary = detail::concat("documents: ", chosen.size(), " (EasyContext's: the first ",
                             o.samples < 0 ? std::string("all") : std::to_string(o.samples), " of the ", qualifying,
                             " with >= ", min_len, " tokens, of ", docs.size(), ")\nwindows: ",
                             o.truncate ? std::string("one per document (--truncate)")
                                        : "every " + std::to_string(stride) + " tokens (sliding window)",
                             "\nrequests: ", s.requests.size(), "\ntokens: ", tokens, "\n");
  log_info("eval ppl: EasyContext's documents: ", chosen.size(), " of the ", qualifying, " with >= ", min_len,
           " tokens (of ", docs.size(), "), ",
           o.truncate ? std::string("one window per document") : "windows every " + std::to_string(stride) + " tokens",
           ", ", s.requests.size(), " request(s), ", format_count(static_cast<double>(tokens)), " tokens");
  return s;
}

Sweep build_sweep(const PplOptions& o, int64_t vocab, int64_t bos, const std::string& first_model) {
  Sweep s;
  s.lengths = ppl_lengths(o);
  const std::vector<std::string> files = shard_files(o.tokenized);
  std::vector<data::TokenShardReader> shards;
  std::vector<DocRef> docs;
  for (size_t f = 0; f < files.size(); ++f) {
    shards.emplace_back(files[f]);
    const auto& off = shards.back().doc_offsets();
    for (size_t d = 0; d + 1 < off.size(); ++d) docs.push_back({f, off[d], off[d + 1] - off[d]});
  }
  if (easycontext_documents(o)) return build_easycontext_sweep(o, vocab, bos, first_model, files, shards, docs, s);
  s.documents.assign(s.lengths.size(), 0);
  std::map<size_t, std::vector<size_t>> selected;  // doc index -> indices of the lengths it is scored at
  for (size_t i = 0; i < s.lengths.size(); ++i) {
    int64_t taken = 0;
    for (size_t d = 0; d < docs.size() && (o.samples < 0 || taken < o.samples); ++d)
      if (static_cast<int64_t>(docs[d].length) >= s.lengths[i]) {
        selected[d].push_back(i);
        ++taken;
      }
    s.documents[i] = taken;
    if (taken == 0 && o.require_every_length) {
      uint64_t longest = 0;
      for (const DocRef& doc : docs) longest = std::max(longest, doc.length);
      EASYCTX_THROW_INPUT("--max-tokens: no document of ", o.tokenized.front(),
                          o.tokenized.size() > 1 ? " (or the other --tokenized inputs)" : "", " has ", s.lengths[i],
                          " tokens (the longest has ", longest, "); lower --max-tokens to at most ", longest,
                          " or add longer documents");
    }
  }
  std::vector<size_t> first_doc(files.size(), 0);  // per file: the index of its first document
  for (size_t d = docs.size(); d-- > 0;) first_doc[docs[d].file] = d;
  int64_t tokens = 0;
  for (const auto& [d, at] : selected) {
    const int64_t lmax = s.lengths[at.back()];
    std::vector<uint32_t> raw = shards[docs[d].file].read(docs[d].offset, static_cast<uint64_t>(lmax));
    ScoreRequest r;
    r.tokens.resize(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      EASYCTX_CHECK_INPUT(raw[i] < static_cast<uint64_t>(vocab), files[docs[d].file], ": token id ", raw[i],
                          " >= the model's vocab_size ", vocab, " (", first_model, ")");
      r.tokens[i] = static_cast<int32_t>(raw[i]);
    }
    for (size_t i : at) r.spans.push_back({0, s.lengths[i] - 1});
    tokens += lmax;
    s.requests.push_back(std::move(r));
    s.at.push_back(at);
    s.what.push_back("document " + std::to_string(d - first_doc[docs[d].file]) + " of " + files[docs[d].file]);
  }
  s.tokens = tokens;
  s.summary = detail::concat("documents: ", selected.size(), " (per length the first ",
                             o.samples < 0 ? std::string("all") : std::to_string(o.samples), " that have L tokens, of ",
                             docs.size(),
                             ")\nwindows: one per document and length\n"
                             "requests: ",
                             s.requests.size(), "\ntokens: ", tokens, "\n");
  log_info("eval ppl: ", docs.size(), " documents in ", files.size(), " file(s), ", selected.size(), " scored (",
           format_count(static_cast<double>(tokens)), " tokens), lengths ", o.min_tokens, "..", o.max_tokens, " step ",
           o.tokens_step);
  return s;
}

std::vector<PplRow> rows_of(const Sweep& s, const std::vector<std::vector<SpanScore>>& scores,
                            const std::string& model) {
  // sums[i] = sum over the spans at lengths[i] (a document each, or EasyContext's windows) of
  // their mean NLL; counts[i] spans.
  std::vector<double> sums(s.lengths.size(), 0.0), counts(s.lengths.size(), 0.0);
  for (size_t r = 0; r < s.requests.size(); ++r)
    for (size_t k = 0; k < s.at[r].size(); ++k) {
      const SpanScore& sc = scores[r][k];
      EASYCTX_CHECK_INPUT(std::isfinite(sc.sum_nll), model, ": the model's loss is not finite (", sc.sum_nll, ") on ",
                          s.what[r], " at length ", s.lengths[s.at[r][k]],
                          " (non-finite activations: overflow in the weights?); no row written");
      sums[s.at[r][k]] += sc.sum_nll / static_cast<double>(sc.count);
      counts[s.at[r][k]] += 1;
    }
  std::vector<PplRow> rows;
  for (size_t i = 0; i < s.lengths.size(); ++i) {
    PplRow r;
    r.tokens = s.lengths[i];
    r.documents = s.documents[i];
    r.mean_nll = counts[i] > 0 ? sums[i] / counts[i] : std::numeric_limits<double>::quiet_NaN();
    r.ppl = std::exp(r.mean_nll);
    rows.push_back(r);
  }
  return rows;
}

// Short unique names: the folders' last components, else their last two, else numbered.
std::vector<std::string> labels_of(const std::vector<ModelRef>& refs) {
  auto unique = [](const std::vector<std::string>& v) {
    std::vector<std::string> s = v;
    std::sort(s.begin(), s.end());
    return std::adjacent_find(s.begin(), s.end()) == s.end();
  };
  std::vector<std::string> a, b;
  for (const ModelRef& r : refs) {
    a.push_back(r.label());
    const std::string parent = std::filesystem::path(r.dir).parent_path().filename().string();
    b.push_back(parent.empty() ? r.label() : parent + "/" + r.label());
  }
  if (unique(a)) return a;
  if (unique(b)) return b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::to_string(i + 1) + ":" + a[i];
  return a;
}

// Python's str(float): the shortest text that reads back as the same double.
std::string shortest(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream os;
    os.precision(p);
    os << v;
    if (std::stod(os.str()) == v) return os.str();
  }
  return std::to_string(v);
}

}  // namespace

bool easycontext_documents(const PplOptions& o) {
  return o.dataset_min_tokens >= 0 || o.truncate || o.sliding_window > 0;
}

std::vector<int64_t> ppl_lengths(const PplOptions& o) {
  std::vector<int64_t> v;
  if (o.tokens_step > 0) {
    for (int64_t L = o.min_tokens; L <= o.max_tokens; L += o.tokens_step) v.push_back(L);
  } else {
    v.push_back(o.min_tokens);
    while (v.back() <= o.max_tokens / 2) v.push_back(v.back() * 2);
  }
  return v;
}

SessionOptions session_options(const PplOptions& o, const std::string& model) {
  SessionOptions so;
  so.model = model;
  so.device = o.device;
  so.rope_theta = o.rope_theta;
  so.sp_mode = o.sp_mode;
  so.sp_size = o.sp_size;
  so.ulysses_size = o.ulysses_size;
  so.attention_head_groups = o.attention_head_groups;
  so.mlp_tile = o.mlp_tile;
  so.lm_head_tile = o.lm_head_tile;
  so.collective_timeout_s = o.collective_timeout_s;
  so.progress = o.progress;
  if (const auto it = o.resolved.find(model); it != o.resolved.end()) so.resolved = it->second;
  return so;
}

std::vector<PplResult> evaluate_perplexity_models(const PplOptions& o, const std::vector<std::string>& models,
                                                  dist::Comm* comm) {
  check_options(o);
  EASYCTX_CHECK_INPUT(!models.empty(), "--model: required (a Hugging Face folder or ckpt:DIR)");
  std::unique_ptr<dist::MpiComm> self;
  if (!comm) {
    self = std::make_unique<dist::MpiComm>(MPI_COMM_SELF, "self", o.collective_timeout_s);
    comm = self.get();
  }
  auto* mpi = dynamic_cast<dist::MpiComm*>(comm);
  EASYCTX_CHECK(mpi != nullptr, "evaluate_perplexity: the communicator must be an MPI (host) one, got '",
                comm->backend(), "'");
  // Each model resolved once (a checkpoint verified once, its files shared among the ranks),
  // then handed to its session: never verified again per rank.
  PplOptions with = o;
  std::vector<ModelRef> refs;
  for (const std::string& m : models) {
    if (!with.resolved.count(m))
      with.resolved[m] = std::make_shared<const ModelRef>(resolve_model(m, mpi->mpi_comm(), o.collective_timeout_s));
    refs.push_back(*with.resolved.at(m));
  }
  const model::LlamaConfig first = model_config(refs[0], o.rope_theta);
  const Sweep sweep = build_sweep(o, first.vocab_size, first.bos_token_id, models[0]);
  const std::vector<std::string> labels = labels_of(refs);
  std::vector<PplResult> out;
  for (size_t m = 0; m < models.size(); ++m) {
    PplResult res;
    res.model = models[m];
    res.label = labels[m];
    std::vector<std::vector<SpanScore>> scores;
    {
      const std::unique_ptr<Session> s = open_session(session_options(with, models[m]), *comm);
      res.describe = s->describe();
      log_info("eval ppl: ", res.label, " on ", res.describe);
      scores = s->score_spans(sweep.requests);
      res.stats = s->stats();
    }
    res.rows = rows_of(sweep, scores, models[m]);
    for (const PplRow& r : res.rows)
      if (!r.documents) log_warn("eval ppl: no document has ", r.tokens, " tokens; ppl is nan");
    out.push_back(std::move(res));
  }
  return out;
}

std::string describe_ppl_sweep(const PplOptions& o, const std::vector<std::string>& models, dist::Comm* comm) {
  check_options(o);
  EASYCTX_CHECK_INPUT(!models.empty(), "--model: required (a Hugging Face folder or ckpt:DIR)");
  std::shared_ptr<const ModelRef> ref;
  if (const auto it = o.resolved.find(models[0]); it != o.resolved.end()) ref = it->second;
  if (!ref) {
    auto* mpi = comm ? dynamic_cast<dist::MpiComm*>(comm) : nullptr;
    ref = std::make_shared<const ModelRef>(
        resolve_model(models[0], mpi ? mpi->mpi_comm() : MPI_COMM_SELF, o.collective_timeout_s));
  }
  const model::LlamaConfig first = model_config(*ref, o.rope_theta);
  const Sweep sweep = build_sweep(o, first.vocab_size, first.bos_token_id, models[0]);
  std::ostringstream os;
  os << "models:";
  for (const std::string& m : models) os << " " << m;
  os << "\nlengths:";
  for (const int64_t L : sweep.lengths) os << " " << L;
  os << "\n" << sweep.summary;
  return os.str();
}

std::vector<PplRow> evaluate_perplexity(const PplOptions& o, dist::Comm* comm) {
  check_options(o);
  EASYCTX_CHECK_INPUT(!o.model_dir.empty(), "--model: required (a Hugging Face folder or ckpt:DIR)");
  return evaluate_perplexity_models(o, {o.model_dir}, comm).at(0).rows;
}

std::string ppl_csv(const std::vector<PplRow>& rows) {
  std::ostringstream os;
  os << "tokens,ppl,documents,nll\n";
  os.precision(10);
  for (const PplRow& r : rows) os << r.tokens << "," << r.ppl << "," << r.documents << "," << r.mean_nll << "\n";
  return os.str();
}

std::string ppl_csv(const std::vector<PplResult>& results) {
  std::ostringstream os;
  os << "model,tokens,ppl,documents,nll\n";
  os.precision(10);
  for (const PplResult& res : results)
    for (const PplRow& r : res.rows)
      os << res.label << "," << r.tokens << "," << r.ppl << "," << r.documents << "," << r.mean_nll << "\n";
  return os.str();
}

std::string write_ppl_events(const std::string& dir, const std::vector<PplResult>& results) {
  std::map<int64_t, std::vector<tb::Scalar>> by_length;  // lengths ascending: TensorBoard's steps in order
  for (const PplResult& res : results)
    for (const PplRow& r : res.rows)
      by_length[r.tokens].emplace_back("eval_ppl/" + res.label, static_cast<float>(r.ppl));
  tb::EventWriter w(dir);
  for (const auto& [tokens, values] : by_length) w.add_scalars(tokens, values);
  return w.path();
}

std::string ppl_csv_wide(const std::vector<PplResult>& results) {
  std::ostringstream os;
  if (results.empty()) return "";
  for (const PplRow& r : results.front().rows) os << "," << r.tokens;
  os << "\n";
  for (const PplResult& res : results) {
    os << res.model;
    for (const PplRow& r : res.rows) os << "," << shortest(r.ppl);
    os << "\n";
  }
  return os.str();
}

LineChart ppl_chart(const std::vector<PplResult>& results) {
  LineChart c;
  c.title = "Perplexity by context length";
  c.x_title = "context length (tokens)";
  c.y_title = "perplexity";
  std::vector<double> xs;
  for (const PplResult& res : results) {
    Series s;
    s.label = res.label;
    for (const PplRow& r : res.rows) {
      s.x.push_back(static_cast<double>(r.tokens));
      s.y.push_back(r.ppl);
      xs.push_back(static_cast<double>(r.tokens));
    }
    c.series.push_back(std::move(s));
  }
  // Evenly spaced lengths (a --tokens-step sweep) on a linear axis; others spanning 8x or more
  // (powers of two, ...) on a log2 one.
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  bool even = true;
  for (size_t i = 2; i < xs.size(); ++i) even = even && xs[i] - xs[i - 1] == xs[1] - xs[0];
  c.log_x = !even && xs.front() > 0 && xs.back() / xs.front() >= 8;
  return c;
}

}  // namespace easyctx::eval
