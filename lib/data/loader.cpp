#include "data/loader.h"

#include "core/checked.h"
#include "core/error.h"
#include "core/json.h"

namespace easyctx::data {

std::string LoaderState::to_json() const {
  Json j = Json::object();
  j.set("seed", std::to_string(seed));  // string: JSON numbers lose 64-bit precision
  j.set("seq_length", seq_length);
  j.set("global_batch", global_batch);
  j.set("dataset_tokens", std::to_string(dataset_tokens));
  j.set("next_step", next_step);
  j.set("next_micro", next_micro);
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text) {
  Json j = parse_json(text, "data loader state");
  LoaderState s;
  try {
    s.seed = std::stoull(j.at("seed").as_string());
    s.dataset_tokens = std::stoull(j.at("dataset_tokens").as_string());
  } catch (const std::logic_error&) {
    EASYCTX_THROW_INPUT("data loader state: seed/dataset_tokens are not unsigned integers: ", text);
  }
  s.seq_length = j.at("seq_length").as_int();
  s.global_batch = j.at("global_batch").as_int();
  s.next_step = j.at("next_step").as_int();
  s.next_micro = j.at("next_micro").as_int();
  return s;
}

bool LoaderState::operator==(const LoaderState& o) const {
  return seed == o.seed && seq_length == o.seq_length && global_batch == o.global_batch &&
         dataset_tokens == o.dataset_tokens && next_step == o.next_step && next_micro == o.next_micro;
}

DataLoader::DataLoader(const LoaderOptions& opts)
    : opts_(opts), dataset_(opts.path), sampler_(dataset_.num_tokens(), opts.seq_length, opts.seed),
      vocab_limit_(dataset_.meta().vocab_size) {
  EASYCTX_CHECK_INPUT(opts_.seq_length > 0 && opts_.seq_length < (int64_t{1} << 31) - 1, "data loader: seq_length ",
                      opts_.seq_length, " outside [1, 2^31 - 2] (positions are int32)");
  const BatchShape& s = opts_.shape;
  EASYCTX_CHECK_INPUT(s.batch_size > 0 && s.grad_accum > 0 && s.dp_size > 0, "data loader: batch_size ",
                      s.batch_size, ", grad_accum ", s.grad_accum, ", dp_size ", s.dp_size, " must all be > 0");
  EASYCTX_CHECK_INPUT(opts_.dp_rank >= 0 && opts_.dp_rank < s.dp_size, "data loader: dp_rank ", opts_.dp_rank,
                      " outside [0, ", s.dp_size, ")");
  EASYCTX_CHECK_INPUT(opts_.sp_size > 0 && opts_.sp_rank >= 0 && opts_.sp_rank < opts_.sp_size,
                      "data loader: sp_rank ", opts_.sp_rank, " outside [0, ", opts_.sp_size, ")");
}

void DataLoader::validate(int64_t model_vocab, const std::string& expected_sha256, bool full_scan) {
  dataset_.validate(model_vocab, expected_sha256, full_scan);
  vocab_limit_ = model_vocab;
}

std::vector<uint32_t> DataLoader::window(uint64_t sample) const {
  const uint64_t n = static_cast<uint64_t>(opts_.seq_length) + 1;
  uint64_t start = sampler_.window_start(sample);
  std::vector<uint32_t> w(n);
  dataset_.read(start, n, w.data());
  if (opts_.check_tokens) dataset_.check_ids(w.data(), n, start, vocab_limit_);
  return w;
}

MicroBatch DataLoader::micro_batch(int64_t step, int64_t micro) const {
  MicroBatch mb;
  mb.step = step;
  mb.micro = micro;
  mb.batch = opts_.shape.batch_size;
  mb.local_len = local_len();
  SpSlice acc;
  const size_t total = static_cast<size_t>(
      checked_elements({mb.batch, mb.local_len}, "data loader: a micro-batch, batch_size x local sequence length"));
  acc.tokens.reserve(total);
  acc.labels.reserve(total);
  acc.positions.reserve(total);
  for (int64_t b = 0; b < mb.batch; ++b) {
    uint64_t i = sample_index(opts_.shape, step, micro, opts_.dp_rank, b);
    std::vector<uint32_t> w = window(i);
    sp_slice_append(w.data(), opts_.seq_length, opts_.sp_layout, opts_.sp_size, opts_.sp_rank, opts_.pad_id, acc,
                    opts_.sp_inner);
    mb.sample_ids.push_back(i);
  }
  mb.tokens = std::move(acc.tokens);
  mb.labels = std::move(acc.labels);
  mb.positions = std::move(acc.positions);
  mb.real_labels = acc.real_labels;
  return mb;
}

MicroBatch DataLoader::next() {
  MicroBatch mb = micro_batch(next_step_, next_micro_);
  if (++next_micro_ == opts_.shape.grad_accum) {
    next_micro_ = 0;
    ++next_step_;
  }
  return mb;
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.seed = opts_.seed;
  s.seq_length = opts_.seq_length;
  s.global_batch = opts_.shape.global();
  s.dataset_tokens = dataset_.num_tokens();
  s.next_step = next_step_;
  s.next_micro = next_micro_;
  return s;
}

void DataLoader::restore(const LoaderState& s) {
  auto mismatch = [&](const char* what, auto saved, auto now) {
    EASYCTX_THROW_INPUT("cannot resume the data cursor: ", what, " was ", saved, " in the checkpoint, ", now,
                        " now (", dataset_.spec(), ")");
  };
  if (s.seed != opts_.seed) mismatch("seed", s.seed, opts_.seed);
  if (s.seq_length != opts_.seq_length) mismatch("seq_length", s.seq_length, opts_.seq_length);
  if (s.dataset_tokens != dataset_.num_tokens()) mismatch("dataset token count", s.dataset_tokens, dataset_.num_tokens());
  if (s.global_batch != opts_.shape.global()) mismatch("global batch (B*accum*dp)", s.global_batch, opts_.shape.global());
  EASYCTX_CHECK_INPUT(s.next_step >= 0 && s.next_micro >= 0 && s.next_micro < opts_.shape.grad_accum,
                      "cannot resume the data cursor: micro-batch ", s.next_micro, " does not exist with grad_accum ",
                      opts_.shape.grad_accum);
  next_step_ = s.next_step;
  next_micro_ = s.next_micro;
}

}  // namespace easyctx::data
