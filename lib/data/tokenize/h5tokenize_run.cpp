#include "data/tokenize/h5tokenize_run.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/sha256.h"
#include "data/shard.h"
#include "data/tokenize/chat.h"
#include "data/tokenize/tokenizer.h"
#include "data/tokenize/utf8.h"
#include "dist/watchdog.h"

namespace easyctx::data {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) EASYCTX_THROW("h5tokenize: ", what, " failed (MPI error ", rc, ")");
}

// The world's ranks (what a timed-out collective's roll call asks; dist/watchdog.h).
const std::vector<int>& world_members(MPI_Comm comm) {
  static std::vector<int> m;
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (static_cast<int>(m.size()) != size) {
    m.resize(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) m[static_cast<size_t>(i)] = i;
  }
  return m;
}

// Waits for a nonblocking collective under the watchdog (timeout_s 0: no limit), sleeping
// between polls: a rank that finished its units early must not take a core from a rank
// still tokenizing (MPI_Barrier busy-polls in Open MPI).
void watched(MPI_Request& req, MPI_Comm comm, const char* op, double timeout_s) {
  dist::Watch w;
  w.op = op;
  w.group = "world";
  w.timeout_s = timeout_s;
  w.members = &world_members(comm);
  w.relaxed = true;
  dist::wait_watched(&req, 1, w);
}

void relaxed_barrier(MPI_Comm comm, const char* op, double timeout_s) {
  dist::fault_point(op, "world");
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
  watched(req, comm, op, timeout_s);
}

std::string shard_name(uint64_t unit, uint64_t part) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%06llu-%04llu.h5", static_cast<unsigned long long>(unit),
                static_cast<unsigned long long>(part));
  return buf;
}

int hist_bucket(uint64_t n) {
  int b = 0;
  while (b < kHistBuckets - 1 && n >= kHistEdges[b]) ++b;
  return b;
}

// Everything that determines a unit's shards, hashed: a finished shard is reused only when
// the fingerprint matches.
std::string unit_fingerprint(const TokenizeOptions& o, const Tokenizer& tok, const WorkUnit& u, double share,
                             const ChatRenderer* chat) {
  Json j = Json::object();
  if (chat) {  // text runs keep their fingerprints, so their resume cursors stay valid
    j.set("format", "chat");
    j.set("chat_template", chat_template_name(chat->chat_template()));
    j.set("loss_on_all", o.loss_on_all);
  }
  j.set("tokenizer", tok.sha256());
  j.set("bos", o.add_bos);
  j.set("eos", o.add_eos);
  j.set("shard_tokens", o.shard_tokens);
  Json tp = Json::array(), sp = Json::array();
  for (const auto& s : o.fields.text_path) tp.push_back(s);
  for (const auto& s : o.fields.source_path) sp.push_back(s);
  j.set("text", tp);
  j.set("source", sp);
  j.set("default_source", o.fields.default_source);
  j.set("upsample", upsample_mode_name(o.upsample.mode));
  j.set("total_tokens", o.upsample.total_tokens);
  j.set("threshold", o.upsample.threshold);
  j.set("keep_prob", o.upsample.keep_prob);
  j.set("chars_per_token", o.upsample.chars_per_token);
  j.set("seed", std::to_string(o.upsample.seed));
  j.set("unit", u.describe());
  j.set("share", share);
  return sha256_hex(j.dump());
}

struct Pending {
  Document doc;
  std::vector<ChatMessage> chat;
  std::vector<uint8_t> weights;  // chat: one per id
  uint64_t record;               // index of the record in the unit
  double est;                    // estimated tokens (upsampling)
  std::vector<uint32_t> ids;
};

class UnitJob {
 public:
  UnitJob(const TokenizeOptions& o, const Tokenizer& tok, const WorkUnit& u, double share, TokenizeStats& st,
          int& warnings, const std::function<void(uint64_t)>& progress, const ChatRenderer* chat)
      : o_(o),
        tok_(tok),
        u_(u),
        st_(st),
        warnings_(warnings),
        progress_(progress),
        chat_(chat),
        fp_(unit_fingerprint(o, tok, u, share, chat)),
        read_ups_(o.upsample, u.index, share),
        commit_ups_(o.upsample, u.index, share) {}
  void run();

 private:
  bool resume();  // false: the unit is already complete
  void read_batch(UnitReader& rd, std::vector<Pending>& batch, bool& at_end);
  void tokenize(std::vector<Pending>& batch);
  void write(Pending& p);
  void open_writer(uint64_t chunk);
  void commit(bool done);
  void warn(const RawRecord& r, const std::string& why);

  const TokenizeOptions& o_;
  const Tokenizer& tok_;
  const WorkUnit& u_;
  TokenizeStats& st_;
  int& warnings_;
  const std::function<void(uint64_t)>& progress_;
  const ChatRenderer* chat_;  // null: text records
  std::string fp_;
  Upsampler read_ups_, commit_ups_;
  std::unique_ptr<TokenShardWriter> writer_;
  uint64_t part_ = 0, records_read_ = 0, last_written_ = 0;
};

void UnitJob::warn(const RawRecord& r, const std::string& why) {
  std::string where = *r.file + ":" + std::to_string(r.line);
  if (o_.strict) EASYCTX_THROW_INPUT(where, ": ", why, " (--strict)");
  if (warnings_ < o_.max_warnings) log_warn(where, ": ", why, "; line skipped");
  if (++warnings_ == o_.max_warnings) log_warn("further malformed-record warnings are only counted");
}

bool UnitJob::resume() {
  // Finished parts 0..k of this unit (stale temporaries are removed).
  for (uint64_t k = 0;; ++k) {
    std::string path = (fs::path(o_.output) / shard_name(u_.index, k)).string();
    std::error_code ec;
    fs::remove(path + ".tmp", ec);
    if (!fs::exists(path)) break;
    ShardMeta m = read_shard_meta(path);
    auto it = m.extra.find("h5tokenize");
    EASYCTX_CHECK_INPUT(it != m.extra.end(), path, ": not written by h5tokenize (no resume cursor); use --overwrite");
    Json c = parse_json(it->second, path + " h5tokenize attribute");
    EASYCTX_CHECK_INPUT(c.at("fingerprint").as_string() == fp_, path,
                        ": made with other options, tokenizer or inputs; use a fresh --output or --overwrite");
    if (c.at("unit_done").as_bool()) return false;
    part_ = k + 1;
    records_read_ = static_cast<uint64_t>(c.at("records").as_int());
    read_ups_.restore(c.at("upsampler").as_string());
    commit_ups_.restore(c.at("upsampler").as_string());
  }
  if (part_ > 0) log_info("unit ", u_.index, ": resuming after ", part_, " finished shard(s), record ", records_read_);
  return true;
}

void UnitJob::read_batch(UnitReader& rd, std::vector<Pending>& batch, bool& at_end) {
  uint64_t text_bytes = 0;
  RawRecord r;
  while (text_bytes < o_.batch_bytes) {
    if (o_.upsample.mode != UpsampleMode::None && read_ups_.all_full()) {
      at_end = true;
      return;
    }
    if (!rd.next(r)) {
      at_end = true;
      return;
    }
    uint64_t idx = records_read_++;
    ++st_.records;
    if (!r.is_text_file && trim(r.data).empty()) {
      ++st_.empty;
      continue;
    }
    Pending p;
    std::string why = chat_ ? parse_chat_record(r, o_.fields, chat_->chat_template(), p.chat, p.doc)
                            : parse_record(r, o_.fields, p.doc);
    if (!why.empty()) {
      ++st_.malformed;
      warn(r, why);
      continue;
    }
    if (p.doc.text.empty()) {
      ++st_.empty;
      continue;
    }
    uint64_t cps = utf8_length(p.doc.text);
    switch (read_ups_.decide(p.doc.source, cps, idx)) {
      case Upsampler::Decision::DropShort: ++st_.dropped_short; continue;
      case Upsampler::Decision::DropFull: ++st_.dropped_full; continue;
      case Upsampler::Decision::Keep: break;
    }
    p.record = idx;
    p.est = read_ups_.estimate(cps);
    read_ups_.count(p.doc.source, p.est);
    text_bytes += p.doc.text.size();
    batch.push_back(std::move(p));
  }
}

void UnitJob::tokenize(std::vector<Pending>& batch) {
  std::string error;
  const int64_t n = static_cast<int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(o_.threads)
  for (int64_t i = 0; i < n; ++i) {
    try {
      Pending& p = batch[i];
      if (chat_) {
        chat_->render(p.chat, p.ids, p.weights);
        std::vector<ChatMessage>().swap(p.chat);
        std::string().swap(p.doc.text);
        continue;
      }
      if (o_.add_bos) p.ids.push_back(static_cast<uint32_t>(tok_.bos_id()));
      tok_.encode_pieces(p.doc.text, p.ids, o_.piece_bytes);
      if (o_.add_eos) p.ids.push_back(static_cast<uint32_t>(tok_.eos_id()));
      std::string().swap(p.doc.text);  // free the text early
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) EASYCTX_THROW("tokenizing unit ", u_.index, " (", u_.describe(), "): ", error);
}

void UnitJob::open_writer(uint64_t chunk) {
  ShardMeta m;
  m.tokenizer_sha256 = tok_.sha256();
  m.tokenizer_name = fs::path(tok_.path()).filename().string();
  m.vocab_size = tok_.vocab_size();
  m.bos_id = tok_.bos_id();
  m.eos_id = tok_.eos_id();
  m.add_bos = chat_ ? chat_->adds_bos() : o_.add_bos;
  m.add_eos = chat_ ? false : o_.add_eos;
  m.has_loss_weights = chat_ != nullptr;
  writer_ = std::make_unique<TokenShardWriter>((fs::path(o_.output) / shard_name(u_.index, part_)).string(), m, chunk,
                                               o_.deflate);
}

void UnitJob::commit(bool done) {
  EASYCTX_CHECK(writer_, "h5tokenize: commit without an open shard");
  Json c = Json::object();
  c.set("fingerprint", fp_);
  c.set("unit", u_.index);
  c.set("part", part_);
  c.set("unit_done", done);
  c.set("records", done ? records_read_ : last_written_ + 1);
  c.set("upsampler", commit_ups_.state_json());
  c.set("inputs", u_.describe());
  writer_->set_extra("h5tokenize", c.dump());
  writer_->commit();
  writer_.reset();
  ++st_.shards;
  ++part_;
}

void UnitJob::write(Pending& p) {
  if (writer_ && writer_->num_tokens() >= o_.shard_tokens) commit(false);
  if (!writer_) open_writer(std::min(o_.chunk_tokens, std::max<uint64_t>(o_.shard_tokens, 1024)));
  writer_->add_document(p.ids.data(), p.ids.size(), writer_->source_index(p.doc.source),
                        chat_ ? p.weights.data() : nullptr);
  commit_ups_.count(p.doc.source, p.est);
  last_written_ = p.record;
  auto& s = st_.sources[p.doc.source];
  ++s.docs;
  s.tokens += p.ids.size();
  ++st_.hist[hist_bucket(p.ids.size())];
}

void UnitJob::run() {
  if (!resume()) {
    ++st_.units_skipped;
    progress_(u_.bytes);
    return;
  }
  UnitReader rd(u_, o_.max_doc_bytes);
  RawRecord r;
  for (uint64_t i = 0; i < records_read_; ++i)
    EASYCTX_CHECK_INPUT(rd.next(r), "unit ", u_.index, " (", u_.describe(),
                        ") has fewer records than its resume "
                        "cursor ",
                        records_read_, ": the input changed; use --overwrite");
  uint64_t reported = 0;
  bool at_end = false;
  while (!at_end) {
    std::vector<Pending> batch;
    read_batch(rd, batch, at_end);
    tokenize(batch);
    for (Pending& p : batch) write(p);
    uint64_t done = rd.bytes_done();
    progress_(done - reported);
    reported = done;
  }
  // A unit with no documents still gets its (empty) last part, which marks it done.
  if (!writer_) open_writer(1024);
  commit(true);
  st_.bytes += u_.bytes;
  progress_(u_.bytes - reported);
  ++st_.units;
}

// Progress: on a terminal one line rewritten twice a second; otherwise (a log file, every
// Slurm job) a full line every 30 s. Documents, tokens, MB/s, ETA (from this rank's share).
class Progress {
 public:
  Progress(bool on, bool tty, uint64_t total_bytes, const TokenizeStats& st)
      : on_(on), tty_(tty), total_(total_bytes), st_(st) {}
  void add(uint64_t bytes) {
    done_ += bytes;
    if (!on_) return;
    auto now = Clock::now();
    if (now - last_ < (tty_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(30000)) &&
        (done_ < total_ || !tty_))
      return;
    last_ = now;
    print(now);
  }
  void finish() {
    if (!on_) return;
    if (tty_) std::fprintf(stderr, "\n");
    else if (st_.total_docs() > 0) print(Clock::now());  // the last figures (none: every unit was done already)
  }

 private:
  void print(Clock::time_point now) {
    double sec = std::chrono::duration<double>(now - start_).count();
    double rate = sec > 0 ? done_ / sec : 0;
    double eta = rate > 0 ? (total_ - std::min(done_, total_)) / rate : 0;
    std::fprintf(stderr, "%s[h5tokenize] %s docs  %s tokens  %.1f MB/s  %3.0f%%  ETA %s%s", tty_ ? "\r" : "",
                 format_count(double(st_.total_docs())).c_str(), format_count(double(st_.total_tokens())).c_str(),
                 rate / 1e6, total_ ? 100.0 * std::min(done_, total_) / total_ : 100.0, format_duration(eta).c_str(),
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  bool on_, tty_;
  uint64_t total_, done_ = 0;
  const TokenizeStats& st_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// The chat renderer when the input is chat (--format chat, or auto and the first record of
// the first unit is a chat record: the same answer on every rank), else null.
std::unique_ptr<ChatRenderer> make_chat_renderer(const TokenizeOptions& o, const Tokenizer& tok,
                                                 const std::vector<WorkUnit>& units) {
  EASYCTX_CHECK_INPUT(o.format == "text" || o.format == "chat" || o.format == "auto", "--format ", o.format,
                      ": expected text, chat or auto");
  bool chat = o.format == "chat";
  if (o.format == "auto" && !units.empty()) {
    UnitReader rd(units[0], o.max_doc_bytes);
    RawRecord r;
    while (rd.next(r)) {
      if (r.is_text_file) break;
      if (trim(r.data).empty()) continue;
      chat = looks_like_chat(r.data);
      break;
    }
  }
  if (!chat) return nullptr;
  const ChatTemplate t =
      o.chat_template == "auto" ? detect_chat_template(o.tokenizer) : parse_chat_template(o.chat_template);
  return std::make_unique<ChatRenderer>(tok, t, o.loss_on_all);
}

TokenizeStats gather(const TokenizeStats& local, MPI_Comm comm) {
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::string mine = local.to_json();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size);
  const double timeout_s = dist::default_collective_timeout_s();
  dist::fault_point("gather statistics", "world");
  MPI_Request req;
  check_mpi(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm, &req), "MPI_Iallgather");
  watched(req, comm, "gather statistics", timeout_s);
  std::vector<int> displs(size, 0);
  for (int i = 1; i < size; ++i) displs[i] = displs[i - 1] + lens[i - 1];
  std::string all(static_cast<size_t>(displs[size - 1] + lens[size - 1]), '\0');
  check_mpi(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm, &req),
            "MPI_Iallgatherv");
  watched(req, comm, "gather statistics", timeout_s);
  TokenizeStats total;
  for (int i = 0; i < size; ++i) total.merge_json(all.substr(displs[i], lens[i]));
  total.seconds = local.seconds;
  return total;
}

}  // namespace

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
  for (const auto& [name, s] : sources) {
    Json o = Json::object();
    o.set("docs", s.docs);
    o.set("tokens", s.tokens);
    src.set(name, o);
  }
  Json h = Json::array();
  for (uint64_t v : hist) h.push_back(v);
  Json j = Json::object();
  j.set("sources", src);
  j.set("length_histogram", h);
  j.set("records", records);
  j.set("malformed", malformed);
  j.set("empty", empty);
  j.set("dropped_short", dropped_short);
  j.set("dropped_full", dropped_full);
  j.set("bytes", bytes);
  j.set("units", units);
  j.set("units_skipped", units_skipped);
  j.set("shards", shards);
  j.set("docs", total_docs());
  j.set("tokens", total_tokens());
  j.set("seconds", seconds);
  return j.dump();
}

void TokenizeStats::merge_json(const std::string& text) {
  Json j = parse_json(text, "h5tokenize stats");
  for (const auto& [name, o] : j.at("sources").as_object()) {
    sources[name].docs += o.at("docs").as_int();
    sources[name].tokens += o.at("tokens").as_int();
  }
  for (int b = 0; b < kHistBuckets; ++b) hist[b] += j.at("length_histogram")[b].as_int();
  records += j.at("records").as_int();
  malformed += j.at("malformed").as_int();
  empty += j.at("empty").as_int();
  dropped_short += j.at("dropped_short").as_int();
  dropped_full += j.at("dropped_full").as_int();
  bytes += j.at("bytes").as_int();
  units += j.at("units").as_int();
  units_skipped += j.at("units_skipped").as_int();
  shards += j.at("shards").as_int();
}

std::string TokenizeStats::format() const {
  std::string s;
  char line[256];
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
  std::snprintf(
      line, sizeof line,
      "\nrecords %llu, skipped: malformed %llu, empty %llu; upsampling dropped: short %llu, "
      "source full %llu\nunits %llu done + %llu already finished, %llu shards written, %.1f s, %.2fM tokens/s\n",
      (unsigned long long)records, (unsigned long long)malformed, (unsigned long long)empty,
      (unsigned long long)dropped_short, (unsigned long long)dropped_full, (unsigned long long)units,
      (unsigned long long)units_skipped, (unsigned long long)shards, seconds,
      seconds > 0 ? total_tokens() / seconds / 1e6 : 0.0);
  s += line;
  return s;
}

TokenizeStats run_h5tokenize(const TokenizeOptions& o, MPI_Comm comm) {
  auto t0 = Clock::now();
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  EASYCTX_CHECK_INPUT(!o.output.empty(), "--output is required");
  EASYCTX_CHECK_INPUT(!o.inputs.empty(), "no input files given");
  EASYCTX_CHECK_INPUT(o.threads >= 1, "--threads must be >= 1");
  EASYCTX_CHECK_INPUT(o.shard_tokens > 0, "--shard-tokens must be > 0");
  EASYCTX_CHECK_INPUT(o.max_doc_bytes > 0, "--max-doc-bytes must be > 0");
  auto tok = load_tokenizer(o.tokenizer);
  std::vector<WorkUnit> units = plan_units(expand_inputs(o.inputs), o.split_bytes);
  std::unique_ptr<ChatRenderer> chat = make_chat_renderer(o, *tok, units);
  // Chat runs take BOS/EOS from the template (its renderer names a missing special token):
  // --no-bos/--eos do not apply, and a ChatML tokenizer without a BOS needs no flag.
  EASYCTX_CHECK_INPUT(chat || !o.add_bos || tok->bos_id() >= 0, o.tokenizer, " has no BOS token; use --no-bos");
  EASYCTX_CHECK_INPUT(chat || !o.add_eos || tok->eos_id() >= 0, o.tokenizer, " has no EOS token; drop --eos");
  uint64_t total_bytes = 0;
  for (const auto& u : units) total_bytes += u.bytes;

  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(o.output, ec);
    EASYCTX_CHECK_INPUT(fs::is_directory(o.output), "cannot create output folder ", o.output, ": ", ec.message());
    if (o.overwrite)
      for (const auto& e : fs::directory_iterator(o.output))
        if (starts_with(e.path().filename().string(), "shard-")) fs::remove(e.path());
    log_info("h5tokenize: ", units.size(), " work unit(s), ", format_bytes(double(total_bytes)), " of input, ", size,
             " rank(s) x ", o.threads, " thread(s), tokenizer ", o.tokenizer, " (", tok->kind(), ", vocab ",
             tok->vocab_size(), ")");
    if (chat)
      log_info("h5tokenize: chat records, template ", chat_template_name(chat->chat_template()), ", loss on ",
               o.loss_on_all ? "every token" : "assistant turns");
  }
  relaxed_barrier(comm, "start barrier", dist::default_collective_timeout_s());

  TokenizeStats st;
  int warnings = 0;
  uint64_t my_bytes = 0;
  for (const auto& u : units)
    if (static_cast<int>(u.index % size) == rank) my_bytes += u.bytes;
  const bool show = rank == 0 && o.progress != 0;
  Progress progress(show, isatty(STDERR_FILENO) != 0, my_bytes, st);
  std::function<void(uint64_t)> on_bytes = [&](uint64_t b) { progress.add(b); };
  for (const auto& u : units) {
    if (static_cast<int>(u.index % size) != rank) continue;
    double share = total_bytes ? double(u.bytes) / double(total_bytes) : 0.0;
    UnitJob(o, *tok, u, share, st, warnings, on_bytes, chat.get()).run();
  }
  progress.finish();
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // The ranks finish their units at different times: no limit here (a dead rank ends the
  // job through mpirun; the quick collectives around it are watched).
  relaxed_barrier(comm, "end barrier", 0);
  TokenizeStats total = gather(st, comm);
  total.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rank == 0) write_file_atomic((fs::path(o.output) / "h5tokenize_summary.json").string(), total.to_json() + "\n");
  return total;
}

}  // namespace easyctx::data
