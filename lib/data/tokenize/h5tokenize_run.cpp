#include "data/tokenize/h5tokenize_run.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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
#include "data/h5util.h"
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
  std::string file;              // where the record is (errors and warnings)
  uint64_t line = 0, bytes = 0;
  double est;         // estimated tokens (upsampling)
  TokenizeStats gap;  // counts of the records read since the previous kept one, this one included
  size_t forced = 0;  // cuts inside a word (Tokenizer::encode_pieces)
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
  void count_finished(const std::string& path);
  void read_batch(UnitReader& rd, std::vector<Pending>& batch, bool& at_end);
  bool read_one(const RawRecord& r, Pending& p);
  void tokenize(std::vector<Pending>& batch);
  void write(Pending& p);
  void open_writer(uint64_t chunk);
  void commit(bool done);
  void warn(const std::string& where, const std::string& why, bool fatal_when_strict = true);

  const TokenizeOptions& o_;
  const Tokenizer& tok_;
  const WorkUnit& u_;
  TokenizeStats& st_;
  int& warnings_;
  const std::function<void(uint64_t)>& progress_;
  const ChatRenderer* chat_;  // null: text records
  std::string fp_;
  Upsampler read_ups_, commit_ups_;
  // Record counts up to the last written document (commit_, what a cursor stores) and of the
  // records read after it (gap_).
  TokenizeStats commit_, gap_;
  std::string bom_file_;  // the last file whose byte-order mark was reported
  std::unique_ptr<TokenShardWriter> writer_;
  uint64_t part_ = 0, records_read_ = 0, last_written_ = 0;
};

void UnitJob::warn(const std::string& where, const std::string& why, bool fatal_when_strict) {
  if (o_.strict && fatal_when_strict) EASYCTX_THROW_INPUT(where, ": ", why, " (--strict)");
  if (warnings_ < o_.max_warnings) log_warn(where, ": ", why);
  if (++warnings_ == o_.max_warnings) log_warn("further warnings about records are only counted");
}

// Adds a finished shard's documents to the statistics (read from the file: the summary counts
// the whole output).
void UnitJob::count_finished(const std::string& path) {
  TokenShardReader r(path);
  const auto& off = r.doc_offsets();
  for (uint64_t d = 0; d < r.num_docs(); ++d) {
    const uint64_t n = off[d + 1] - off[d];
    auto& s = st_.sources[r.sources()[r.doc_source()[d]]];
    ++s.docs;
    s.tokens += n;
    ++st_.hist[hist_bucket(n)];
  }
  ++st_.shards;
}

bool UnitJob::resume() {
  // Finished parts 0..k of this unit (stale temporaries are removed).
  std::string counts;
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
    count_finished(path);
    counts = c.find("counts") ? c.at("counts").dump() : std::string();
    if (c.at("unit_done").as_bool()) {
      if (!counts.empty()) st_.merge_json(counts);
      return false;
    }
    part_ = k + 1;
    records_read_ = static_cast<uint64_t>(c.at("records").as_int());
    read_ups_.restore(c.at("upsampler").as_string());
    commit_ups_.restore(c.at("upsampler").as_string());
  }
  if (!counts.empty()) commit_.merge_json(counts);
  if (part_ > 0) log_info("unit ", u_.index, ": resuming after ", part_, " finished shard(s), record ", records_read_);
  return true;
}

// Parses one non-blank record into p and decides upsampling; false when it is not kept (the
// reason counted in gap_).
bool UnitJob::read_one(const RawRecord& r, Pending& p) {
  std::string why = chat_ ? parse_chat_record(r, o_.fields, chat_->chat_template(), p.chat, p.doc)
                          : parse_record(r, o_.fields, p.doc);
  if (!why.empty()) {
    gap_.skip(*r.file, u_.index, r.line, why);
    warn(*r.file + ":" + std::to_string(r.line), why + "; line skipped");
    return false;
  }
  if (p.doc.text.empty()) {
    ++gap_.empty;
    return false;
  }
  uint64_t cps = utf8_length(p.doc.text);
  switch (read_ups_.decide(p.doc.source, cps, records_read_ - 1)) {
    case Upsampler::Decision::DropShort: ++gap_.dropped_short; return false;
    case Upsampler::Decision::DropFull: ++gap_.dropped_full; return false;
    case Upsampler::Decision::Keep: break;
  }
  p.record = records_read_ - 1;
  p.file = *r.file;
  p.line = r.line;
  p.bytes = r.data.size();
  p.est = read_ups_.estimate(cps);
  read_ups_.count(p.doc.source, p.est);
  return true;
}

void UnitJob::read_batch(UnitReader& rd, std::vector<Pending>& batch, bool& at_end) {
  uint64_t text_bytes = 0;
  RawRecord r;
  while (text_bytes < o_.batch_bytes) {
    if ((o_.upsample.mode != UpsampleMode::None && read_ups_.all_full()) || !rd.next(r)) {
      at_end = true;
      return;
    }
    ++records_read_;
    if (r.bom) {
      ++gap_.boms;
      if (bom_file_ != *r.file)
        log_warn(*r.file, ":", r.line,
                 ": a UTF-8 byte-order mark at the start of the line, removed (said once per file)");
      bom_file_ = *r.file;
    }
    if (!r.is_text_file && trim(r.data).empty()) {
      ++gap_.blank;
      continue;
    }
    ++gap_.records;
    Pending p;
    try {
      if (!read_one(r, p)) continue;
    } catch (const std::bad_alloc&) {
      EASYCTX_THROW(*r.file, ":", r.line, ": out of memory parsing this record (", r.data.size(),
                    " bytes); give the job more memory, or lower --max-doc-bytes to refuse such records");
    }
    p.gap = std::move(gap_);
    gap_ = TokenizeStats();
    text_bytes += p.doc.text.size();
    batch.push_back(std::move(p));
  }
}

void UnitJob::tokenize(std::vector<Pending>& batch) {
  std::string error;
  const int64_t n = static_cast<int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(o_.threads)
  for (int64_t i = 0; i < n; ++i) {
    Pending& p = batch[i];
    try {
      if (chat_) {
        p.forced = chat_->render(p.chat, p.ids, p.weights);
        std::vector<ChatMessage>().swap(p.chat);
        std::string().swap(p.doc.text);
        continue;
      }
      if (o_.add_bos) p.ids.push_back(static_cast<uint32_t>(tok_.bos_id()));
      p.forced = tok_.encode_pieces(p.doc.text, p.ids, o_.piece_bytes);
      if (o_.add_eos) p.ids.push_back(static_cast<uint32_t>(tok_.eos_id()));
      std::string().swap(p.doc.text);  // free the text early
    } catch (const std::bad_alloc&) {
#pragma omp critical
      if (error.empty())
        error = detail::concat(p.file, ":", p.line, ": out of memory tokenizing this record (", p.bytes,
                               " bytes); give the job more memory, or lower --threads or --max-doc-bytes");
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = detail::concat(p.file, ":", p.line, ": tokenizing this record: ", e.what());
    }
  }
  if (!error.empty()) EASYCTX_THROW("unit ", u_.index, ": ", error);
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
  if (done) {  // the records after the last document are the unit's too
    commit_.add(gap_);
    gap_ = TokenizeStats();
  }
  Json c = Json::object();
  c.set("fingerprint", fp_);
  c.set("unit", u_.index);
  c.set("part", part_);
  c.set("unit_done", done);
  c.set("records", done ? records_read_ : last_written_ + 1);
  c.set("upsampler", commit_ups_.state_json());
  c.set("inputs", u_.describe());
  c.set("counts", parse_json(commit_.to_json(), "counts"));
  writer_->set_extra("h5tokenize", c.dump());
  writer_->commit();
  writer_.reset();
  ++st_.shards;
  ++st_.shards_written;
  ++part_;
}

void UnitJob::write(Pending& p) {
  if (writer_ && writer_->num_tokens() >= o_.shard_tokens) commit(false);
  if (!writer_) open_writer(std::min(o_.chunk_tokens, std::max<uint64_t>(o_.shard_tokens, 1024)));
  writer_->add_document(p.ids.data(), p.ids.size(), writer_->source_index(p.doc.source),
                        chat_ ? p.weights.data() : nullptr);
  commit_ups_.count(p.doc.source, p.est);
  commit_.add(p.gap);
  if (p.forced) {
    ++commit_.forced_cuts;
    warn(p.file + ":" + std::to_string(p.line),
         detail::concat("cut ", p.forced, " time(s) inside a word: ", 4 * o_.piece_bytes,
                        " bytes without a space or line break (the tokens next to a cut may differ from encoding the "
                        "record whole)"),
         false);
  }
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
  st_.add(commit_);  // the unit's record counts (its documents were counted as written)
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

// What one sampled record is (detect_format).
enum class Kind { Chat, Text, Neither };
Kind record_kind(const RawRecord& r, const FieldOptions& fields) {
  if (r.is_text_file) return Kind::Text;
  try {
    const Json j = parse_json(r.data, "record");
    if (!j.is_object()) return Kind::Neither;
    if (j.find("messages") || (j.find("prompt") && j.find("response"))) return Kind::Chat;
    const Json* t = j.find_path(fields.text_path);
    return t && t->is_string() ? Kind::Text : Kind::Neither;
  } catch (const Error&) { return Kind::Neither; }
}

// The chat renderer when the input is chat (--format chat; auto with a named chat template or
// --loss-on, or when detect_format says so: the same answer on every rank), else null.
std::unique_ptr<ChatRenderer> make_chat_renderer(const TokenizeOptions& o, const Tokenizer& tok,
                                                 const std::vector<WorkUnit>& units, bool log) {
  EASYCTX_CHECK_INPUT(o.format == "text" || o.format == "chat" || o.format == "auto", "--format ", o.format,
                      ": expected text, chat or auto");
  const bool named = o.chat_template != "auto";
  EASYCTX_CHECK_INPUT(o.format != "text" || (!named && !o.loss_on_given), "--format text with ",
                      named ? "--chat-template " + o.chat_template : std::string("--loss-on"),
                      ", which applies to chat records only: drop one of them");
  bool chat = o.format == "chat";
  if (o.format == "auto" && (named || o.loss_on_given)) {
    chat = true;
    if (log) log_info("h5tokenize: chat records (", named ? "--chat-template" : "--loss-on", " given)");
  } else if (o.format == "auto") {
    std::string why;
    chat = detect_format(units, o.fields, o.max_doc_bytes, why) == "chat";
    if (log) log_info("h5tokenize: --format auto: ", chat ? "chat" : "text", " records (", why, ")");
  }
  if (!chat) return nullptr;
  const ChatTemplate t = named ? parse_chat_template(o.chat_template) : detect_chat_template(o.tokenizer);
  return std::make_unique<ChatRenderer>(tok, t, o.loss_on_all, o.piece_bytes);
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

std::string detect_format(const std::vector<WorkUnit>& units, const FieldOptions& fields, uint64_t max_record_bytes,
                          std::string& why) {
  uint64_t n[3] = {0, 0, 0}, files = 0;
  std::string first_neither;
  for (const WorkUnit& u : units)
    for (const InputPiece& piece : u.pieces) {
      if (piece.begin != 0 || files == uint64_t(kFormatSampleFiles)) continue;  // a file's start, once
      ++files;
      WorkUnit one;
      one.pieces.push_back(piece);
      UnitReader rd(one, max_record_bytes);
      RawRecord r;
      try {
        for (int k = 0; k < kFormatSampleRecords && rd.next(r);) {
          if (!r.is_text_file && trim(r.data).empty()) continue;
          ++k;
          const Kind kind = record_kind(r, fields);
          ++n[static_cast<int>(kind)];
          if (kind == Kind::Neither && first_neither.empty()) first_neither = *r.file + ":" + std::to_string(r.line);
        }
      } catch (const InputError&) {}  // a corrupt or unreadable file: its unit's reader says so, in turn
    }
  const uint64_t chat = n[0], text = n[1], neither = n[2];
  why =
      detail::concat("of ", chat + text + neither, " records sampled from ", files, " file(s): ", chat, " chat, ", text,
                     " text, ", neither, " neither", first_neither.empty() ? "" : " (first " + first_neither + ")");
  if (chat > 0 && text > 0) log_warn("h5tokenize: --format auto: the input mixes chat and text records (", why, ")");
  return chat > text ? "chat" : "text";
}

// Rank 0, before any work: the output folder exists and takes a file (a read-only file
// system or folder fails here, named, instead of at the first shard).
void check_output_folder(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  EASYCTX_CHECK_INPUT(fs::is_directory(out), "cannot create output folder ", out, ": ", ec.message());
  const std::string probe = (fs::path(out) / (".h5tokenize-write-test-" + std::to_string(::getpid()))).string();
  FILE* f = std::fopen(probe.c_str(), "wb");
  const int err = errno;
  if (f) std::fclose(f);
  fs::remove(probe, ec);
  EASYCTX_CHECK_INPUT(f, "the output folder ", out, " is not writable (", std::strerror(err),
                      "): give --output a folder this user can write to");
}

// The message for a shard that could not be written: the file, the cause and what to do.
std::string write_failure(const h5::IoError& e, const TokenizeOptions& o, uint64_t shards_done) {
  std::string s = "h5tokenize: " + std::string(e.what()) + ". ";
  if (e.err() == ENOSPC || e.err() == EDQUOT) {
    s += "The output's file system is full (or over its quota): free space there or give another --output";
  } else if (e.err() == EFBIG) {
    struct rlimit lim {};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    s += "A shard outgrew the file-size limit";
    if (lim.rlim_cur != RLIM_INFINITY) s += " (ulimit -f: " + format_bytes(double(lim.rlim_cur)) + ")";
    s += detail::concat(": raise it, or lower --shard-tokens (now ", o.shard_tokens,
                        "; a shard file takes 4 to 10 bytes a token)");
  } else if (e.err() == EROFS || e.err() == EACCES || e.err() == EPERM) {
    s += "The output folder " + o.output + " is not writable: give --output a folder this user can write to";
  } else {
    s += "Check the output's file system";
  }
  return s + detail::concat("; a rerun of the same command resumes after the last finished shard (this rank wrote ",
                            shards_done,
                            " shard(s); every finished shard is complete and valid, the unfinished one "
                            "was removed)");
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
  EASYCTX_CHECK_INPUT(o.max_skipped_fraction >= 0 && o.max_skipped_fraction <= 1,
                      "--max-skipped-fraction must be in [0, 1]");
  auto tok = load_tokenizer(o.tokenizer);
  std::vector<WorkUnit> units = plan_units(expand_inputs(o.inputs), o.split_bytes);
  std::unique_ptr<ChatRenderer> chat = make_chat_renderer(o, *tok, units, rank == 0);
  // Chat runs take BOS/EOS from the template (its renderer names a missing special token):
  // --no-bos/--eos do not apply, and a ChatML tokenizer without a BOS needs no flag.
  EASYCTX_CHECK_INPUT(chat || !o.add_bos || tok->bos_id() >= 0, o.tokenizer, " has no BOS token; use --no-bos");
  EASYCTX_CHECK_INPUT(chat || !o.add_eos || tok->eos_id() >= 0, o.tokenizer, " has no EOS token; drop --eos");
  uint64_t total_bytes = 0;
  for (const auto& u : units) total_bytes += u.bytes;

  if (rank == 0) {
    check_output_folder(o.output);
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
    try {
      UnitJob(o, *tok, u, share, st, warnings, on_bytes, chat.get()).run();
    } catch (const h5::IoError& e) { throw Error(write_failure(e, o, st.shards_written)); }
  }
  progress.finish();
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // The ranks finish their units at different times: no limit here (a dead rank ends the
  // job through mpirun; the quick collectives around it are watched).
  relaxed_barrier(comm, "end barrier", 0);
  TokenizeStats total = gather(st, comm);
  total.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rank == 0) write_file_atomic((fs::path(o.output) / "h5tokenize_summary.json").string(), total.to_json() + "\n");
  const std::string skipped = total.skipped_error(o.max_skipped_fraction);
  if (!skipped.empty()) throw SkippedRecordsError("h5tokenize: " + skipped, total);
  return total;
}

}  // namespace easyctx::data
