#include "data/loader.h"

#include <algorithm>
#include <map>

#include "core/checked.h"
#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/doc_balance.h"

namespace easyctx::data {

std::string LoaderState::to_json() const {
  Json j = Json::object();
  j.set("seed", std::to_string(seed));  // string: JSON numbers lose 64-bit precision
  j.set("seq_length", seq_length);
  j.set("global_batch", global_batch);
  j.set("dataset_tokens", std::to_string(dataset_tokens));
  j.set("next_step", next_step);
  j.set("next_micro", next_micro);
  if (packing != "window") j.set("packing", packing);  // window cursors stay as they were
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
  if (const Json* p = j.find("packing")) s.packing = p->as_string();
  return s;
}

bool LoaderState::operator==(const LoaderState& o) const {
  return seed == o.seed && seq_length == o.seq_length && global_batch == o.global_batch &&
         dataset_tokens == o.dataset_tokens && next_step == o.next_step && next_micro == o.next_micro &&
         packing == o.packing;
}

namespace {
// Packed modes never cut stream windows: their sampler only has to exist, so a dataset
// shorter than one window (a small SFT set) is not refused for it.
uint64_t sampler_tokens(const LoaderOptions& o, const TokenDataset& d) {
  if (o.packing == DataPacking::Window) return d.num_tokens();
  return std::max<uint64_t>(d.num_tokens(), static_cast<uint64_t>(std::max<int64_t>(o.seq_length, 0)) + 1);
}
}  // namespace

DataLoader::DataLoader(const LoaderOptions& opts)
    : opts_(opts),
      dataset_(opts.path),
      sampler_(sampler_tokens(opts, dataset_), opts.seq_length, opts.seed),
      vocab_limit_(dataset_.meta().vocab_size) {
  EASYCTX_CHECK_INPUT(opts_.seq_length > 0 && opts_.seq_length < (int64_t{1} << 31) - 1, "data loader: seq_length ",
                      opts_.seq_length, " outside [1, 2^31 - 2] (positions are int32)");
  const BatchShape& s = opts_.shape;
  EASYCTX_CHECK_INPUT(s.batch_size > 0 && s.grad_accum > 0 && s.dp_size > 0, "data loader: batch_size ", s.batch_size,
                      ", grad_accum ", s.grad_accum, ", dp_size ", s.dp_size, " must all be > 0");
  EASYCTX_CHECK_INPUT(opts_.dp_rank >= 0 && opts_.dp_rank < s.dp_size, "data loader: dp_rank ", opts_.dp_rank,
                      " outside [0, ", s.dp_size, ")");
  EASYCTX_CHECK_INPUT(opts_.sp_size > 0 && opts_.sp_rank >= 0 && opts_.sp_rank < opts_.sp_size, "data loader: sp_rank ",
                      opts_.sp_rank, " outside [0, ", opts_.sp_size, ")");
  EASYCTX_CHECK_INPUT(opts_.pack_pool > 0, "data loader: pack_pool ", opts_.pack_pool, " must be > 0");
  if (opts_.packing != DataPacking::Window) build_packing();
  else count_unlabelled_windows();
}

// (The pieces left out are named only when there are some, so that the cursors of data
// without them read as before.)
std::string DataLoader::packing_name() const {
  const std::string left_out =
      census_.unlabelled > 0 ? ", " + std::to_string(census_.unlabelled) + " unlabelled pieces left out" : "";
  switch (opts_.packing) {
    case DataPacking::Window: return "window";
    case DataPacking::BestFit:
      return "best_fit pool " + std::to_string(opts_.pack_pool) +
             (opts_.long_documents == LongDocuments::Split ? " split" : " refuse") + left_out;
    case DataPacking::OnePerWindow:
      return std::string("one_per_window") + (opts_.long_documents == LongDocuments::Split ? " split" : " refuse") +
             left_out;
  }
  return "?";
}

std::string LabelCensus::describe() const {
  std::string out;
  if (unlabelled > 0 && unlabelled_docs > 0)
    out = std::to_string(unlabelled) + " of " + std::to_string(units) + " pieces (from " +
          std::to_string(unlabelled_docs) +
          " documents) hold no labelled token and are left out of the packing (every target of theirs has loss "
          "weight 0: a prompt longer than data.seq_length cut by data.long_documents: split); the first: " +
          first;
  else if (unlabelled > 0)
    out = std::to_string(unlabelled) + " of " + std::to_string(units) +
          " windows per epoch hold no labelled token (every target has loss weight 0); a step made only of such "
          "windows is a step with no update; the first: " +
          first;
  if (!zero_weight_files.empty())
    out += std::string(out.empty() ? "" : "; ") + "every loss weight is 0 in " + join(zero_weight_files, ", ") +
           " (they add no loss)";
  return out;
}

namespace {
// Calls fn(t) for each stream offset t whose loss weight is 1, in order, counting them per file
// into `ones`.
template <class Fn>
void for_each_weighted(const TokenDataset& d, std::vector<uint64_t>& ones, Fn&& fn) {
  ones.assign(d.num_files(), 0);
  d.scan_weights([&](uint64_t at, const uint8_t* w, uint64_t n) {
    const size_t f = d.file_of(at);
    for (uint64_t i = 0; i < n; ++i)
      if (w[i]) {
        ++ones[f];
        fn(at + i);
      }
  });
}

// The files whose every loss weight is 0 (`ones`: weighted tokens per file); a dataset made only
// of them is refused, naming them: it would train nothing, step after step.
std::vector<std::string> zero_weight_files(const TokenDataset& d, const std::vector<uint64_t>& ones) {
  std::vector<std::string> zero;
  uint64_t total = 0;
  for (size_t f = 0; f < ones.size(); ++f) {
    total += ones[f];
    if (ones[f] == 0 && d.file_tokens(f) > 0) zero.push_back(d.file(f));
  }
  EASYCTX_CHECK_INPUT(total > 0, "data.path ", d.spec(), ": every loss weight is 0 in ", join(zero, ", "),
                      ": no token is a training target, so there is nothing to train (h5tokenize --format chat "
                      "weights the assistant's messages 1; docs/data.md, \"Token shards\")");
  return zero;
}
}  // namespace

std::string DataLoader::describe_piece(uint64_t p) const {
  const std::vector<uint64_t>& ds = dataset_.doc_starts();
  const uint64_t d = piece_doc_[p], n = ds[d + 1] - ds[d], L = static_cast<uint64_t>(opts_.seq_length);
  if (n <= L) return dataset_.describe_doc(d);
  return dataset_.describe_doc(d) + " piece " + std::to_string((piece_start_[p] - ds[d]) / L + 1) + " of " +
         std::to_string((n + L - 1) / L);
}

std::string DataLoader::describe_sample(uint64_t sample) const {
  if (opts_.packing != DataPacking::Window) {
    std::string out;
    for (uint64_t p : ordered_pieces(epoch_index(sample))) out += (out.empty() ? "" : ", ") + describe_piece(p);
    return out;
  }
  return describe_window(sampler_.window_start(sample));
}

std::string DataLoader::describe_window(uint64_t start) const {
  const uint64_t end = start + static_cast<uint64_t>(opts_.seq_length) + 1;
  const std::vector<uint64_t>& ds = dataset_.doc_starts();
  const uint64_t first = static_cast<uint64_t>(std::upper_bound(ds.begin(), ds.end(), start) - ds.begin()) - 1;
  const uint64_t last = static_cast<uint64_t>(std::lower_bound(ds.begin(), ds.end(), end) - ds.begin()) - 1;
  const size_t f = dataset_.file_of(start);
  uint64_t local = start;
  for (size_t i = 0; i < f; ++i) local -= dataset_.file_tokens(i);
  return "window of stream tokens [" + std::to_string(start) + ", " + std::to_string(end) +
         "): " + dataset_.describe_doc(first) +
         (last > first ? " and the next " + std::to_string(last - first) + " document(s)" : "") + ", file tokens " +
         std::to_string(local) + ".." + std::to_string(local + (end - start) - 1);
}

// Pieces: every non-empty document in stream order; one longer than L is cut into L-token
// pieces (split) or refused.
void DataLoader::make_pieces() {
  const std::vector<uint64_t>& ds = dataset_.doc_starts();
  const int64_t L = opts_.seq_length;
  for (uint64_t d = 0; d + 1 < ds.size(); ++d) {
    const uint64_t n = ds[d + 1] - ds[d];
    if (n == 0) continue;
    if (n > static_cast<uint64_t>(L) && opts_.long_documents == LongDocuments::Refuse)
      EASYCTX_THROW_INPUT(dataset_.describe_doc(d), " has ", n, " tokens, more than data.seq_length ", L,
                          " (data.long_documents: refuse; use split to cut it into pieces)");
    for (uint64_t off = 0; off < n; off += static_cast<uint64_t>(L)) {
      const uint64_t len = std::min<uint64_t>(n - off, static_cast<uint64_t>(L));
      piece_start_.push_back(ds[d] + off);
      piece_len_.push_back(static_cast<int64_t>(len));
      piece_next_.push_back(off + len < n ? 1 : 0);
      piece_doc_.push_back(d);
    }
  }
  EASYCTX_CHECK_INPUT(!piece_start_.empty(), dataset_.spec(), ": no non-empty documents to pack");
}

// A piece's targets are stream [start + 1, start + len + next): without a 1 among their
// weights (or with none at all: a 1-token document) it adds nothing to the loss, only padding
// to a sequence or, alone, a step with no update. Pieces are in stream order and their target
// ranges disjoint, so one pass over the weights marks them.
void DataLoader::keep_labelled_pieces() {
  const uint64_t P = piece_start_.size();
  std::vector<uint8_t> labelled(P);
  for (uint64_t p = 0; p < P; ++p) labelled[p] = !dataset_.has_loss_weights() && (piece_len_[p] > 1 || piece_next_[p]);
  if (dataset_.has_loss_weights()) {
    std::vector<uint64_t> ones;
    uint64_t p = 0;
    for_each_weighted(dataset_, ones, [&](uint64_t t) {
      while (p < P && piece_start_[p] + static_cast<uint64_t>(piece_len_[p]) + piece_next_[p] <= t) ++p;
      if (p < P && t > piece_start_[p]) labelled[p] = 1;
    });
    census_.zero_weight_files = zero_weight_files(dataset_, ones);
  }
  census_.units = P;
  uint64_t kept = 0, last_doc = ~uint64_t{0};
  for (uint64_t p = 0; p < P; ++p) {
    if (!labelled[p]) {
      if (census_.unlabelled++ == 0) census_.first = describe_piece(p);
      census_.unlabelled_docs += piece_doc_[p] != last_doc;
      last_doc = piece_doc_[p];
      continue;
    }
    piece_start_[kept] = piece_start_[p];
    piece_len_[kept] = piece_len_[p];
    piece_next_[kept] = piece_next_[p];
    piece_doc_[kept++] = piece_doc_[p];
  }
  for (auto* v : {&piece_start_, &piece_doc_}) v->resize(kept);
  piece_len_.resize(kept);
  piece_next_.resize(kept);
  EASYCTX_CHECK_INPUT(kept > 0, "data.path ", dataset_.spec(), ": none of its ", P,
                      " pieces holds a labelled token (a target with loss weight 1), so there is nothing to train; "
                      "the first: ",
                      census_.first);
}

// Window mode: window j's targets are stream [j L + 1, j L + L], less the document starts under
// data.document_mask. Counted from the weights (and the document starts); a window without a
// labelled target stays (the stream is cut alike for every seed), said at start.
void DataLoader::count_unlabelled_windows() {
  const uint64_t N = sampler_.windows_per_epoch(), L = static_cast<uint64_t>(opts_.seq_length);
  census_.units = N;
  if (!dataset_.has_loss_weights() && !opts_.document_mask) return;
  const std::vector<uint64_t> none;
  const std::vector<uint64_t>& ds = opts_.document_mask ? dataset_.doc_starts() : none;
  std::vector<uint8_t> labelled(N, 0);
  if (dataset_.has_loss_weights()) {
    std::vector<uint64_t> ones;
    size_t di = 0;
    for_each_weighted(dataset_, ones, [&](uint64_t t) {
      if (t == 0 || (t - 1) / L >= N) return;
      while (di < ds.size() && ds[di] < t) ++di;
      if (di < ds.size() && ds[di] == t) return;  // the document mask drops this target
      labelled[(t - 1) / L] = 1;
    });
    census_.zero_weight_files = zero_weight_files(dataset_, ones);
  } else {  // every target a document start: only a window of 1-token documents
    std::vector<uint64_t> starts(N, 0);
    for (uint64_t t : ds)
      if (t > 0 && (t - 1) / L < N) ++starts[(t - 1) / L];
    for (uint64_t j = 0; j < N; ++j) labelled[j] = starts[j] < L;
  }
  for (uint64_t j = 0; j < N; ++j)
    if (!labelled[j] && census_.unlabelled++ == 0) census_.first = describe_window(j * L);
  EASYCTX_CHECK_INPUT(census_.unlabelled < N, "data.path ", dataset_.spec(), ": none of its ", N,
                      " windows holds a labelled token (a target with loss weight 1), so there is nothing to train; "
                      "the first: ",
                      census_.first);
}

// best_fit: the pieces in a seed-keyed shuffled order, taken in pools of pack_pool; inside a
// pool, longest first (ties: earlier piece first), each piece goes to the open sequence with the
// least free room that still holds it, or opens a new one; a pool's sequences are closed when the
// pool ends. one_per_window: one piece per sequence.
void DataLoader::build_packing() {
  make_pieces();
  keep_labelled_pieces();
  const int64_t L = opts_.seq_length;
  const uint64_t P = piece_start_.size();
  seq_begin_.push_back(0);
  if (opts_.packing == DataPacking::OnePerWindow) {
    for (uint64_t p = 0; p < P; ++p) {
      seq_pieces_.push_back(p);
      seq_begin_.push_back(seq_pieces_.size());
    }
    return;
  }
  const Permutation shuffle(P, mix64(opts_.seed ^ 0xb357f1770ac4ull));
  const uint64_t pool = static_cast<uint64_t>(opts_.pack_pool);
  std::vector<uint64_t> items;
  std::vector<std::vector<uint64_t>> seqs;
  std::multimap<int64_t, size_t> room;  // free room -> open sequence of this pool
  for (uint64_t b = 0; b < P; b += pool) {
    items.clear();
    for (uint64_t k = b; k < std::min(P, b + pool); ++k) items.push_back(shuffle(k));
    std::sort(items.begin(), items.end(), [&](uint64_t x, uint64_t y) {
      return piece_len_[x] != piece_len_[y] ? piece_len_[x] > piece_len_[y] : x < y;
    });
    seqs.clear();
    room.clear();
    for (uint64_t p : items) {
      auto it = room.lower_bound(piece_len_[p]);
      size_t s;
      int64_t free;
      if (it == room.end()) {
        s = seqs.size();
        seqs.emplace_back();
        free = L;
      } else {
        // Among equal free room the multimap keeps insertion order; take the first.
        s = it->second;
        free = it->first;
        room.erase(it);
      }
      seqs[s].push_back(p);
      free -= piece_len_[p];
      if (free > 0) room.emplace(free, s);
    }
    for (const auto& q : seqs) {
      seq_pieces_.insert(seq_pieces_.end(), q.begin(), q.end());
      seq_begin_.push_back(seq_pieces_.size());
    }
  }
}

uint64_t DataLoader::packed_tokens() const {
  uint64_t n = 0;
  for (int64_t len : piece_len_) n += static_cast<uint64_t>(len);
  return n;
}

uint64_t DataLoader::sequences_per_epoch() const {
  return opts_.packing == DataPacking::Window ? sampler_.windows_per_epoch() : seq_begin_.size() - 1;
}

std::vector<std::pair<uint64_t, int64_t>> DataLoader::sequence_pieces(uint64_t k) const {
  std::vector<std::pair<uint64_t, int64_t>> v;
  if (opts_.packing == DataPacking::Window) return v;
  EASYCTX_CHECK(k + 1 < seq_begin_.size(), "sequence_pieces: ", k, " outside [0, ", seq_begin_.size() - 1, ")");
  for (uint64_t p : ordered_pieces(k)) v.emplace_back(piece_start_[p], piece_len_[p]);
  return v;
}

// Packing's order (best fit: longest first), or, under the document mask on a ring layout,
// the order balance_document_order finds for the ring's ranks (seeded by seed and k).
std::vector<uint64_t> DataLoader::ordered_pieces(uint64_t k) const {
  std::vector<uint64_t> pieces(seq_pieces_.begin() + static_cast<std::ptrdiff_t>(seq_begin_[k]),
                               seq_pieces_.begin() + static_cast<std::ptrdiff_t>(seq_begin_[k + 1]));
  const SpLayout layout = opts_.sp_layout;
  const int ring = layout == SpLayout::Usp ? opts_.sp_size / std::max(opts_.sp_inner, 1) : opts_.sp_size;
  if (!opts_.document_mask || pieces.size() < 2 || ring < 2 || (layout != SpLayout::Zigzag && layout != SpLayout::Usp))
    return pieces;
  std::vector<int64_t> lengths;
  for (uint64_t p : pieces) lengths.push_back(piece_len_[p]);
  const int64_t Lp = sp_padded_length(opts_.seq_length, layout, opts_.sp_size, opts_.sp_inner);
  std::vector<uint64_t> out;
  for (size_t i : balance_document_order(lengths, Lp, ring, mix64(opts_.seed ^ mix64(k + 0xd0cba1ull))))
    out.push_back(pieces[i]);
  return out;
}

// Sample i of a packed run: epoch e = i / N visits the N sequences in the order of a
// permutation keyed by (seed, e), the same rule as the window sampler.
uint64_t DataLoader::epoch_index(uint64_t sample) const {
  const uint64_t n = sequences_per_epoch();
  const uint64_t epoch = sample / n;
  Permutation perm(n, mix64(opts_.seed ^ mix64(epoch + 0x5eed)));
  return perm(sample % n);
}

void DataLoader::validate(int64_t model_vocab, const std::string& expected_sha256, bool full_scan) {
  dataset_.validate(model_vocab, expected_sha256, full_scan);
  vocab_limit_ = model_vocab;
}

std::vector<uint32_t> DataLoader::window(uint64_t sample) const {
  EASYCTX_CHECK(opts_.packing == DataPacking::Window, "DataLoader::window: data.packing is ", packing_name(),
                "; use sequence()");
  const uint64_t n = static_cast<uint64_t>(opts_.seq_length) + 1;
  uint64_t start = sampler_.window_start(sample);
  std::vector<uint32_t> w(n);
  dataset_.read(start, n, w.data());
  if (opts_.check_tokens) dataset_.check_ids(w.data(), n, start, vocab_limit_);
  return w;
}

namespace {
// Positions 0..Lp-1, or, with document masking, restarting at 0 at each of q.doc_starts.
void set_positions(SpSequence& q, int64_t Lp, bool document_mask) {
  size_t d = 0;
  for (int64_t p = 0; p < Lp; ++p) {
    if (d + 1 < q.doc_starts.size() && q.doc_starts[d + 1] == p) ++d;
    q.positions[p] = static_cast<int32_t>(document_mask ? p - q.doc_starts[d] : p);
  }
}
}  // namespace

// Window mode with loss weights or document masking: today's window, labels -1 where the
// target's weight is 0, and (document_mask) positions restarting at every document start.
SpSequence DataLoader::window_sequence(uint64_t start) const {
  const int64_t L = opts_.seq_length;
  const int64_t Lp = sp_padded_length(L, opts_.sp_layout, opts_.sp_size, opts_.sp_inner);
  const uint64_t n = static_cast<uint64_t>(L) + 1;
  std::vector<uint32_t> w(n);
  std::vector<uint8_t> wt(n);
  dataset_.read(start, n, w.data());
  if (opts_.check_tokens) dataset_.check_ids(w.data(), n, start, vocab_limit_);
  dataset_.read_weights(start, n, wt.data());
  SpSequence q;
  q.tokens.assign(static_cast<size_t>(Lp), opts_.pad_id);
  q.labels.assign(static_cast<size_t>(Lp), -1);
  q.positions.resize(static_cast<size_t>(Lp));
  for (int64_t p = 0; p < L; ++p) {
    q.tokens[p] = static_cast<int32_t>(w[p]);
    q.labels[p] = wt[p + 1] ? static_cast<int32_t>(w[p + 1]) : -1;
  }
  q.doc_starts.push_back(0);
  if (opts_.document_mask) {
    const std::vector<uint64_t>& ds = dataset_.doc_starts();
    // Document starts in (start, start + L]: the one at start + L only drops the last label.
    for (auto it = std::upper_bound(ds.begin(), ds.end(), start); it != ds.end() && *it <= start + L; ++it) {
      const int64_t off = static_cast<int64_t>(*it - start);
      q.labels[off - 1] = -1;
      if (off < L && off != q.doc_starts.back()) q.doc_starts.push_back(off);
    }
    append_padding_starts(q.doc_starts, L, Lp);
  }
  set_positions(q, Lp, opts_.document_mask);
  return q;
}

// Packed sequence k: its pieces back to back, then padding (pad_id, label -1) to Lp.
SpSequence DataLoader::packed_sequence(uint64_t k) const {
  const int64_t L = opts_.seq_length;
  const int64_t Lp = sp_padded_length(L, opts_.sp_layout, opts_.sp_size, opts_.sp_inner);
  SpSequence q;
  q.tokens.assign(static_cast<size_t>(Lp), opts_.pad_id);
  q.labels.assign(static_cast<size_t>(Lp), -1);
  q.positions.resize(static_cast<size_t>(Lp));
  q.doc_starts.push_back(0);
  int64_t at = 0;
  std::vector<uint32_t> w;
  std::vector<uint8_t> wt;
  for (const uint64_t p : ordered_pieces(k)) {
    const uint64_t start = piece_start_[p];
    const int64_t len = piece_len_[p];
    const uint64_t n = static_cast<uint64_t>(len) + (piece_next_[p] ? 1 : 0);
    w.resize(n);
    wt.resize(n);
    dataset_.read(start, n, w.data());
    if (opts_.check_tokens) dataset_.check_ids(w.data(), n, start, vocab_limit_);
    dataset_.read_weights(start, n, wt.data());
    if (opts_.document_mask && at > 0) q.doc_starts.push_back(at);
    for (int64_t j = 0; j < len; ++j) {
      q.tokens[at + j] = static_cast<int32_t>(w[j]);
      const bool has_target = static_cast<uint64_t>(j) + 1 < n;
      q.labels[at + j] = has_target && wt[j + 1] ? static_cast<int32_t>(w[j + 1]) : -1;
    }
    at += len;
  }
  EASYCTX_CHECK(at <= L, "packed sequence ", k, " holds ", at, " tokens, more than seq_length ", L);
  if (opts_.document_mask && at > 0) append_padding_starts(q.doc_starts, at, Lp);
  set_positions(q, Lp, opts_.document_mask);
  return q;
}

SpSequence DataLoader::sequence(uint64_t sample) const {
  if (opts_.packing == DataPacking::Window) return window_sequence(sampler_.window_start(sample));
  return packed_sequence(epoch_index(sample));
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
  // Pre-training windows without weights or masking take today's path unchanged.
  const bool plain = opts_.packing == DataPacking::Window && !opts_.document_mask && !dataset_.has_loss_weights();
  for (int64_t b = 0; b < mb.batch; ++b) {
    uint64_t i = sample_index(opts_.shape, step, micro, opts_.dp_rank, b);
    if (plain) {
      std::vector<uint32_t> w = window(i);
      sp_slice_append(w.data(), opts_.seq_length, opts_.sp_layout, opts_.sp_size, opts_.sp_rank, opts_.pad_id, acc,
                      opts_.sp_inner);
    } else {
      sp_slice_sequence_append(sequence(i), opts_.seq_length, opts_.sp_layout, opts_.sp_size, opts_.sp_rank, acc,
                               opts_.sp_inner);
    }
    mb.sample_ids.push_back(i);
  }
  mb.tokens = std::move(acc.tokens);
  mb.labels = std::move(acc.labels);
  mb.positions = std::move(acc.positions);
  mb.real_labels = acc.real_labels;
  mb.doc_starts = std::move(acc.doc_starts);
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
  s.packing = packing_name();
  return s;
}

void DataLoader::restore(const LoaderState& s) {
  auto mismatch = [&](const char* what, auto saved, auto now) {
    EASYCTX_THROW_INPUT("cannot resume the data cursor: ", what, " was ", saved, " in the checkpoint, ", now, " now (",
                        dataset_.spec(), ")");
  };
  if (s.seed != opts_.seed) mismatch("seed", s.seed, opts_.seed);
  if (s.seq_length != opts_.seq_length) mismatch("seq_length", s.seq_length, opts_.seq_length);
  if (s.dataset_tokens != dataset_.num_tokens())
    mismatch("dataset token count", s.dataset_tokens, dataset_.num_tokens());
  if (s.global_batch != opts_.shape.global())
    mismatch("global batch (B*accum*dp)", s.global_batch, opts_.shape.global());
  if (s.packing != packing_name()) mismatch("data packing", s.packing, packing_name());
  EASYCTX_CHECK_INPUT(s.next_step >= 0 && s.next_micro >= 0 && s.next_micro < opts_.shape.grad_accum,
                      "cannot resume the data cursor: micro-batch ", s.next_micro, " does not exist with grad_accum ",
                      opts_.shape.grad_accum);
  next_step_ = s.next_step;
  next_micro_ = s.next_micro;
}

}  // namespace easyctx::data
