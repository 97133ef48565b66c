#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include "ckpt/hf_model.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "model/llama.h"

namespace easyctx::eval {
namespace {

using ops::DType;

struct DocRef {
  size_t file = 0;
  uint64_t offset = 0;  // in its shard
  uint64_t length = 0;
};

void check_options(const PplOptions& o) {
  EASYCTX_CHECK_INPUT(!o.model_dir.empty(), "--model: required (a Hugging Face folder)");
  EASYCTX_CHECK_INPUT(!o.tokenized.empty(), "--tokenized: required (h5tokenize shards)");
  EASYCTX_CHECK_INPUT(o.min_tokens >= 2, "--min-tokens: ", o.min_tokens, " (must be >= 2: one prediction needs 2 tokens)");
  EASYCTX_CHECK_INPUT(o.max_tokens >= o.min_tokens, "--max-tokens: ", o.max_tokens, " is below --min-tokens ",
                      o.min_tokens);
  EASYCTX_CHECK_INPUT(o.tokens_step > 0, "--tokens-step: ", o.tokens_step, " (must be > 0)");
  EASYCTX_CHECK_INPUT(o.samples == -1 || o.samples > 0, "--samples: ", o.samples, " (must be > 0)");
  EASYCTX_CHECK_INPUT(o.mlp_tile >= 0, "--mlp-tile: ", o.mlp_tile, " (must be >= 0; 0: untiled)");
}

std::vector<std::string> shard_files(const std::vector<std::string>& specs) {
  std::vector<std::string> files;
  for (const std::string& s : specs)
    for (const std::string& f : data::TokenDataset::resolve(s)) files.push_back(f);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

}  // namespace

std::string resolve_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path p(dir);
  if (fs::is_regular_file(p / "config.json") || !fs::is_directory(p)) return dir;  // (load names a missing one)
  if (fs::is_regular_file(p / "final" / "config.json")) {
    log_info("eval ppl: ", dir, " is a training run: evaluating its export ", (p / "final").string());
    return (p / "final").string();
  }
  EASYCTX_CHECK_INPUT(!fs::is_directory(p / "checkpoints"), "--model ", dir, ": a training run without a final/ "
                      "export (the run has not finished, or output.export_hf is false); export a checkpoint with "
                      "`easyctx_convert --from ckpt:", dir, " --to hf:OUT` and pass --model OUT");
  EASYCTX_THROW_INPUT("--model ", dir, ": not a Hugging Face model folder (no config.json) nor a training run's "
                      "output.dir (no final/config.json)");
}

std::vector<PplRow> evaluate_perplexity(const PplOptions& o, dist::Comm* comm) {
  check_options(o);
  const std::string model_dir = resolve_model_dir(o.model_dir);
  model::LlamaConfig mc = model::load_llama_config(model_dir);
  if (o.rope_theta > 0) mc.rope_theta = o.rope_theta;
  auto be = ops::make_cpu_backend();
  model::ModelOptions mo;
  mo.lm_head_tile = o.lm_head_tile;
  mo.mlp_tile = o.mlp_tile;
  model::LlamaModel m(mc, *be, DType::F32, mo);
  std::vector<ops::Buffer> pbuf;
  std::vector<ops::Tensor> params;
  for (const auto& u : m.layout().units()) {
    pbuf.push_back(be->alloc(DType::F32, u.numel));
    params.push_back(pbuf.back().flat());
  }
  ckpt::load_hf_weights(model_dir, m.layout(), params);

  std::vector<int64_t> lengths;
  for (int64_t L = o.min_tokens; L <= o.max_tokens; L += o.tokens_step) lengths.push_back(L);
  // Documents in storage order; per length the first K with >= L tokens.
  const std::vector<std::string> files = shard_files(o.tokenized);
  std::vector<data::TokenShardReader> shards;
  std::vector<DocRef> docs;
  for (size_t f = 0; f < files.size(); ++f) {
    shards.emplace_back(files[f]);
    const auto& off = shards.back().doc_offsets();
    for (size_t d = 0; d + 1 < off.size(); ++d) docs.push_back({f, off[d], off[d + 1] - off[d]});
  }
  std::map<size_t, std::vector<size_t>> selected;  // doc index -> indices of the lengths it is scored at
  for (size_t i = 0; i < lengths.size(); ++i) {
    int64_t taken = 0;
    for (size_t d = 0; d < docs.size() && (o.samples < 0 || taken < o.samples); ++d)
      if (static_cast<int64_t>(docs[d].length) >= lengths[i]) {
        selected[d].push_back(i);
        ++taken;
      }
  }
  log_info("eval ppl: ", mc.describe(), "; ", docs.size(), " documents in ", files.size(), " file(s), ",
           selected.size(), " scored, lengths ", o.min_tokens, "..", o.max_tokens, " step ", o.tokens_step);

  // sums[i] = sum over scored documents of their mean NLL at lengths[i]; counts[i] documents.
  std::vector<double> sums(lengths.size(), 0.0), counts(lengths.size(), 0.0);
  const int rank = comm ? comm->rank() : 0, size = comm ? comm->size() : 1;
  size_t nth = 0;
  for (const auto& [d, at] : selected) {
    const int64_t lmax = lengths[at.back()];
    if (static_cast<int>(nth++ % static_cast<size_t>(size)) != rank) continue;
    std::vector<uint32_t> raw = shards[docs[d].file].read(docs[d].offset, static_cast<uint64_t>(lmax));
    std::vector<int32_t> tokens(raw.size()), positions(raw.size()), labels(raw.size(), -1);
    for (size_t i = 0; i < raw.size(); ++i) {
      EASYCTX_CHECK_INPUT(raw[i] < static_cast<uint64_t>(mc.vocab_size), files[docs[d].file], ": token id ", raw[i],
                          " >= the model's vocab_size ", mc.vocab_size);
      tokens[i] = static_cast<int32_t>(raw[i]);
      positions[i] = static_cast<int32_t>(i);
      if (i + 1 < raw.size()) labels[i] = static_cast<int32_t>(raw[i + 1]);
    }
    const int64_t n = lmax;
    model::Batch b{ops::Tensor(tokens.data(), DType::I32, {n}), ops::Tensor(positions.data(), DType::I32, {n}),
                   ops::Tensor(labels.data(), DType::I32, {n}), 1, n};
    const ops::Tensor hidden = m.forward_hidden(params, b);
    // Score rows [0, L-1) for each selected L, incrementally: each row's loss once.
    double running = 0;
    int64_t done = 0;
    for (size_t i : at) {
      const int64_t upto = lengths[i] - 1;
      ops::Tensor lab(labels.data() + done, DType::I32, {upto - done});
      running += m.head_loss(params, hidden.rows(done, upto - done), lab).sum_nll;
      done = upto;
      sums[i] += running / static_cast<double>(upto);
      counts[i] += 1;
    }
  }
  if (comm && size > 1) {
    comm->all_reduce(sums.data(), sums.size(), dist::ReduceOp::Sum);
    comm->all_reduce(counts.data(), counts.size(), dist::ReduceOp::Sum);
  }
  std::vector<PplRow> rows;
  for (size_t i = 0; i < lengths.size(); ++i) {
    PplRow r;
    r.tokens = lengths[i];
    r.documents = static_cast<int64_t>(counts[i]);
    r.mean_nll = r.documents ? sums[i] / counts[i] : std::numeric_limits<double>::quiet_NaN();
    r.ppl = std::exp(r.mean_nll);
    if (!r.documents) log_warn("eval ppl: no document has ", r.tokens, " tokens; ppl is nan");
    rows.push_back(r);
  }
  return rows;
}

std::string ppl_csv(const std::vector<PplRow>& rows) {
  std::ostringstream os;
  os << "tokens,ppl,documents,nll\n";
  os.precision(10);
  for (const PplRow& r : rows) os << r.tokens << "," << r.ppl << "," << r.documents << "," << r.mean_nll << "\n";
  return os.str();
}

}  // namespace easyctx::eval
