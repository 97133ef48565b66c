#include "ckpt/sharded_checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ckpt/rank_sync.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/h5util.h"
#include "dist/runtime.h"

namespace fs = std::filesystem;

namespace easyctx::ckpt {
namespace h5 = data::h5;

namespace {

const char* kCommitted = "COMMITTED";

uint32_t crc_of_bytes(const void* p, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* b = static_cast<const Bytef*>(p);
  size_t left = bytes;
  while (left > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, b, chunk);
    b += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}
uint32_t crc_of(const float* p, int64_t n) { return crc_of_bytes(p, static_cast<size_t>(n) * sizeof(float)); }

std::string rank_file_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.h5", r);
  return buf;
}

void fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  EASYCTX_CHECK(fd >= 0, "cannot open ", p, " to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  EASYCTX_CHECK(rc == 0, "fsync of ", p, " failed: ", std::strerror(e));
}

// After fsync the pages are clean: dropping them makes the read-back come from the disk, not
// from the copy the writer left in memory.
void drop_cached(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// "step\nindex_crc32 XXXXXXXX\n": the marker carries the index's checksum.
std::string committed_text(int64_t step, const std::string& index_text) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld\nindex_crc32 %08x\n", static_cast<long long>(step),
                crc_of_bytes(index_text.data(), index_text.size()));
  return buf;
}

// Test hook: whether EASYCTX_FAULT names this point (and step and rank), and the action.
std::string fault_action(const char* point, int rank, int64_t step) {
  const char* env = std::getenv("EASYCTX_FAULT");
  if (!env || !*env) env = std::getenv("EASYCTX_CKPT_CRASH");
  if (!env || !*env) return "";
  const std::vector<std::string> parts = split(env, ':');
  std::string want = parts[0];
  if (size_t at = want.find('@'); at != std::string::npos) {
    if (step < 0 || std::atoll(want.c_str() + at + 1) != step) return "";
    want.resize(at);
  }
  if (want != point) return "";
  if (parts.size() > 1 && !parts[1].empty() && std::atoi(parts[1].c_str()) != rank) return "";
  return parts.size() > 2 && !parts[2].empty() ? parts[2] : "kill";
}

void write_dataset(const h5::Handle& f, const std::string& ds_name, const float* data, int64_t n,
                   const std::string& path) {
  hsize_t dims[1] = {static_cast<hsize_t>(n)};
  h5::Handle space(H5Screate_simple(1, dims, nullptr), h5::Handle::Kind::Dataspace, "H5Screate_simple", path);
  h5::Handle ds(H5Dcreate2(f, ds_name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                h5::Handle::Kind::Dataset, "H5Dcreate2", path);
  h5::check(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", path);
}

// Reads dataset slice_<i> of an open file and checks its length and CRC against listing entry
// `e` ([name, global, offset, length, crc]); throws InputError naming file and dataset.
void verify_dataset(const h5::Handle& f, size_t i, const Json& e, const std::string& path) {
  const std::string ds_name = "slice_" + std::to_string(i);
  h5::Handle ds = h5::open_dataset(f, ds_name.c_str(), path);
  const int64_t n = e[3].as_int();
  const int64_t have_n = static_cast<int64_t>(h5::dataset_length(ds, ds_name.c_str(), path));
  EASYCTX_CHECK_INPUT(have_n == n, path, ": ", ds_name, " (", e[0].as_string(), ") has the wrong length (", have_n,
                      " elements, the index says ", n, ")");
  std::vector<float> buf(static_cast<size_t>(n));
  h5::read_1d(ds, H5T_NATIVE_FLOAT, 0, static_cast<uint64_t>(n), buf.data(), ds_name.c_str(), path);
  const uint32_t have = crc_of(buf.data(), n);
  const uint32_t want = static_cast<uint32_t>(e[4].as_int());
  if (have != want) {
    // Both values in the message: what the index expected and what the file holds, so a report
    // of a corrupt file says which copy of the checkpoint it was checked against.
    char crcs[64];
    std::snprintf(crcs, sizeof crcs, "CRC32 %08x, index.json records %08x", have, want);
    EASYCTX_THROW_INPUT(path, ": ", ds_name, " (", e[0].as_string(), ") fails its checksum (", crcs,
                        "): the file is corrupt");
  }
}

// The run id in a step folder's index.json, without checking its files ("" when unlabelled);
// throws when the index cannot be read.
std::string index_run_id(const std::string& dir) {
  const Json index = parse_json(read_file(dir + "/index.json"), dir + "/index.json");
  const Json* r = index.find("run_id");
  return r && r->is_string() ? r->as_string() : "";
}

// What a failed write's errno adds to HDF5's message, which does not say why.
std::string io_reason() {
  const int e = errno;
  if (e == ENOSPC || e == EFBIG || e == EDQUOT || e == EIO || e == EROFS)
    return std::string(" (") + std::strerror(e) + ")";
  return "";
}

// Moves `dir` to <aside>/<label>/checkpoints/<its name>[.k] (a rename: nothing is deleted).
std::string move_aside(const std::string& dir, const std::string& aside, const std::string& label) {
  const fs::path parent = fs::path(aside) / (label.empty() ? "unlabelled" : label) / "checkpoints";
  fs::create_directories(parent);
  const std::string name = fs::path(dir).filename().string();
  fs::path dest = parent / name;
  for (int k = 1; fs::exists(dest); ++k) dest = parent / (name + "." + std::to_string(k));
  fs::rename(dir, dest);
  return dest.string();
}

// The one spelling of the array kinds (ArrayKind): "<prefix><unit>".
const char* kind_prefix(ArrayKind kind) {
  switch (kind) {
    case ArrayKind::Master: return "master/";
    case ArrayKind::AdamM: return "adam_m/";
    case ArrayKind::AdamV: return "adam_v/";
  }
  EASYCTX_THROW("unknown checkpoint array kind ", static_cast<int>(kind));
}
}  // namespace

std::string array_name(ArrayKind kind, const std::string& unit) { return kind_prefix(kind) + unit; }

bool is_weight_array(const std::string& name) { return starts_with(name, kind_prefix(ArrayKind::Master)); }

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

int64_t step_of_dir(const std::string& name) {
  if (!starts_with(name, "step-")) return -1;
  std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

void fault_point(const char* point, int rank, int64_t step) {
  const std::string action = fault_action(point, rank, step);
  if (action.empty()) return;
  std::fprintf(stderr, "EASYCTX_FAULT: %s rank %d at '%s'%s\n", action.c_str(), rank, point,
               step >= 0 ? (" (step " + std::to_string(step) + ")").c_str() : "");
  std::fflush(stderr);
  if (action == "term") {
    std::raise(SIGTERM);
  } else if (action == "usr1") {
    std::raise(SIGUSR1);
  } else if (action == "stall") {
    for (int i = 0; i < 3600; ++i) ::sleep(1);
  } else {
    std::raise(SIGKILL);
  }
}

CheckpointWriter::CheckpointWriter(MPI_Comm comm, std::string root, int64_t step, WriterOptions opts)
    : comm_(comm), root_(std::move(root)), step_(step), opts_(std::move(opts)) {
  dist::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  dist::check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  if (opts_.aside_dir.empty()) opts_.aside_dir = root_ + "/aside";
  sync_ = std::make_unique<RankSync>(comm_, opts_.timeout_s, "checkpoint step " + std::to_string(step_));
}

CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::add(const std::string& name, int64_t global_numel, int64_t offset, const float* data,
                           int64_t length) {
  EASYCTX_CHECK(offset >= 0 && length >= 0 && offset + length <= global_numel, "checkpoint slice ", name, " [", offset,
                ", ", offset + length, ") outside [0, ", global_numel, ")");
  if (length > 0) slices_.push_back({name, global_numel, offset, length, data});
}

// Rank 0: what is at step-N already, and a clean step-N.tmp. "new": nothing committed there;
// "ours": a committed checkpoint of this run (verified next, collectively); "other": a
// committed checkpoint of another run or an unreadable one (moved aside at the commit).
std::string CheckpointWriter::prepare() {
  const std::string tmp = root_ + "/" + step_dir_name(step_) + ".tmp";
  const std::string final_dir = root_ + "/" + step_dir_name(step_);
  fs::create_directories(root_);
  fs::remove_all(tmp);  // a crashed earlier attempt at this step
  std::string state = "new";
  if (fs::exists(final_dir)) {
    if (!fs::exists(fs::path(final_dir) / kCommitted)) {
      fs::remove_all(final_dir);  // an uncommitted leftover: never a checkpoint anyone can load
    } else {
      state = "other";
      try {
        if (index_run_id(final_dir) == opts_.run_id) state = "ours";
      } catch (const std::exception&) {}
    }
  }
  fs::create_directories(tmp);
  return state;
}

// Step 2: this rank's file, written, synced and read back. Returns its listing for the index.
Json CheckpointWriter::write_own_file(std::string& err) {
  const std::string tmp = root_ + "/" + step_dir_name(step_) + ".tmp";
  const std::string file = tmp + "/" + rank_file_name(rank_);
  Json mine = Json::object();
  Json listing = Json::array();
  const std::string rank_meta = rank_meta_.dump();
  errno = 0;
  try {
    {
      h5::Handle f = h5::create_file(file);
      for (size_t i = 0; i < slices_.size(); ++i) {
        const Slice& s = slices_[i];
        write_dataset(f, "slice_" + std::to_string(i), s.data, s.length, file);
        Json e = Json::array();
        e.push_back(s.name);
        e.push_back(s.global_numel);
        e.push_back(s.offset);
        e.push_back(s.length);
        e.push_back(static_cast<int64_t>(crc_of(s.data, s.length)));
        listing.push_back(e);
      }
      h5::write_attr_string(f, "rank_meta", rank_meta, file);
      h5::write_attr_int(f, "step", step_, file);
      h5::write_attr_int(f, "rank", rank_, file);
      h5::check(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush", file);
    }
    fsync_path(file, false);
    drop_cached(file);
    // Read back what reached the disk: a checkpoint is verified before it is committed.
    h5::Handle f = h5::open_file(file, false);
    for (size_t i = 0; i < listing.size(); ++i) verify_dataset(f, i, listing[i], file);
    EASYCTX_CHECK(h5::read_attr_string(f, "rank_meta", file) == rank_meta, file, ": rank_meta reads back different");
  } catch (const std::exception& e) {
    err = e.what();
    if (err.find("HDF5") != std::string::npos) err += io_reason();
    return mine;
  }
  mine.set("file", rank_file_name(rank_));
  mine.set("bytes", static_cast<int64_t>(fs::file_size(file)));
  mine.set("slices", listing);
  mine.set("rank_meta_crc", static_cast<int64_t>(crc_of_bytes(rank_meta.data(), rank_meta.size())));
  return mine;
}

// Step 3 on rank 0: the index, the commit, `latest`. Returns "" or what went wrong (the
// temporary folder is then removed; nothing committed was touched).
std::string CheckpointWriter::commit_on_root(const std::vector<std::string>& reports, const std::string& state,
                                             const Json& meta) {
  const std::string tmp = root_ + "/" + step_dir_name(step_) + ".tmp";
  const std::string final_dir = root_ + "/" + step_dir_name(step_);
  std::string failed;
  std::vector<Json> listings;
  for (size_t r = 0; r < reports.size(); ++r) {
    const Json rep = parse_json(reports[r], "checkpoint report of rank " + std::to_string(r));
    if (const Json* e = rep.find("error"); e && !e->as_string().empty())
      failed += (failed.empty() ? "" : "; ") + (reports.size() > 1 ? "rank " + std::to_string(r) + ": " : "") +
                e->as_string();
    else listings.push_back(rep.at("listing"));
  }
  try {
    if (!failed.empty()) EASYCTX_THROW(failed);
    Json index = Json::object();
    index.set("format", "easyctx-checkpoint-1");
    index.set("step", step_);
    index.set("world_size", size_);
    if (!opts_.run_id.empty()) index.set("run_id", opts_.run_id);
    if (!opts_.config_hash.empty()) index.set("config_hash", opts_.config_hash);
    index.set("meta", meta);
    Json files = Json::array();
    for (Json& l : listings) files.push_back(std::move(l));
    index.set("files", files);
    const std::string index_text = index.dump(1);
    write_file_atomic(tmp + "/index.json", index_text);
    fsync_path(tmp + "/index.json", false);
    EASYCTX_CHECK(read_file(tmp + "/index.json") == index_text, tmp, "/index.json reads back different");
    fsync_path(tmp, true);
    fault_point("before_commit", rank_, step_);
    // A committed checkpoint in the way (another run's, or this run's failing verification)
    // is set aside, never deleted: it is not this run's verified state.
    if (state == "other" || state == "ours") {
      std::string label;
      try {
        label = index_run_id(final_dir);
      } catch (const std::exception&) { label = "unreadable"; }
      if (state == "ours") label += (label.empty() ? "" : "-") + std::string("broken");
      const std::string dest = move_aside(final_dir, opts_.aside_dir, label);
      log_warn("checkpoint ", final_dir,
               (state == "ours" ? " (this run's, failing verification)" : " (not this run's)"), " moved to ", dest,
               " to make room for step ", step_);
    }
    fs::rename(tmp, final_dir);
    fault_point("after_rename", rank_, step_);
    write_file_atomic(final_dir + "/" + kCommitted, committed_text(step_, index_text));
    fsync_path(final_dir + "/" + kCommitted, false);
    fsync_path(final_dir, true);
    fsync_path(root_, true);
    fault_point("before_latest", rank_, step_);
    write_file_atomic(root_ + "/latest", step_dir_name(step_) + "\n");
    fsync_path(root_, true);
  } catch (const std::exception& e) {
    std::error_code ec;
    if (fs::exists(tmp, ec)) fs::remove_all(tmp, ec);  // frees the space a failed save took
    return e.what();
  }
  return "";
}

// Step 4 on rank 0: this run's checkpoints older than the new one beyond keep_last, and
// temporary folders of interrupted saves. Other runs' checkpoints are never pruned.
void CheckpointWriter::prune(int64_t keep_last) {
  std::vector<CheckpointEntry> mine;
  for (const CheckpointEntry& e : list_checkpoints(root_))
    if (e.problem.empty() && e.run_id == opts_.run_id && e.step < step_) mine.push_back(e);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 1) - 1); i < mine.size(); ++i)
    fs::remove_all(mine[i].path);
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string n = e.path().filename().string();
    if (ends_with(n, ".tmp")) fs::remove_all(e.path());
  }
}

std::string CheckpointWriter::commit(const Json& meta, int64_t keep_last) {
  h5::quiet_errors();
  const std::string final_dir = root_ + "/" + step_dir_name(step_);
  const std::string what = "checkpoint step " + std::to_string(step_) + " not written";
  fault_point("start", rank_, step_);

  // 1. Rank 0 looks at step-N and prepares step-N.tmp.
  const std::string state =
      sync_->reduce("", "starting the save", "preparing the step folder", [&](const std::vector<std::string>&) {
        try {
          return prepare();
        } catch (const std::exception& e) { EASYCTX_THROW(what, ": cannot prepare ", root_, ": ", e.what()); }
      });
  if (state == "ours") {
    // Re-saving a step of this run (a stop request right after a periodic save, or at the
    // start of a resumed run): the state is the same; keep the committed copy if it verifies.
    const std::string problem = verify_collectively(*sync_, final_dir);
    if (problem.empty()) {
      skipped_ = true;
      std::error_code ec;
      if (rank_ == 0) fs::remove_all(final_dir + ".tmp", ec);
      return final_dir;
    }
    if (rank_ == 0) log_warn(final_dir, " fails verification (", problem, "); writing step ", step_, " again");
  }

  // 2. Every rank writes, syncs and reads back its own file.
  std::string err;
  Json listing = write_own_file(err);
  fault_point("rank_file", rank_, step_);
  Json report = Json::object();
  report.set("error", err);
  report.set("listing", listing);

  // 3. Rank 0 writes the index and commits; every rank learns the outcome.
  const std::string verdict =
      sync_->reduce(report.dump(), "writing its checkpoint file", "committing the checkpoint",
                    [&](const std::vector<std::string>& reports) { return commit_on_root(reports, state, meta); });
  if (!verdict.empty()) EASYCTX_THROW(what, " (the previous checkpoints are intact): ", verdict);

  // 4. Only now that the new one is committed and verified: prune.
  if (rank_ == 0) {
    fault_point("before_prune", rank_, step_);
    try {
      prune(keep_last);
    } catch (const std::exception& e) {
      log_warn("pruning old checkpoints under ", root_, " failed (step ", step_, " is committed): ", e.what());
    }
    fault_point("after_prune", rank_, step_);
  }
  return final_dir;
}

// ---------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  EASYCTX_CHECK_INPUT(fs::is_directory(path_), "checkpoint ", path_, ": no such folder");
  EASYCTX_CHECK_INPUT(fs::exists(path_ + "/" + kCommitted), "checkpoint ", path_,
                      ": not committed (no COMMITTED marker; the save was interrupted)");
  const std::string index_text = read_file(path_ + "/index.json");
  // The marker of a checkpoint written since run ids exist holds the index's CRC32.
  const std::string marker = read_file(path_ + "/" + kCommitted);
  if (size_t at = marker.find("index_crc32 "); at != std::string::npos) {
    const uint32_t want = static_cast<uint32_t>(std::strtoul(marker.c_str() + at + 12, nullptr, 16));
    const uint32_t have = crc_of_bytes(index_text.data(), index_text.size());
    EASYCTX_CHECK_INPUT(want == have, "checkpoint ", path_, ": index.json fails its checksum (", kCommitted,
                        " records a CRC32 the file does not have): the index is corrupt");
  }
  index_ = parse_json(index_text, path_ + "/index.json");
  EASYCTX_CHECK_INPUT(index_.find("format") && index_.at("format").as_string() == "easyctx-checkpoint-1", path_,
                      "/index.json: not an easyctx checkpoint index (format easyctx-checkpoint-1 expected)");
  step_ = index_.at("step").as_int();
  const auto& files = index_.at("files").as_array();
  std::vector<std::string> problems;
  for (size_t f = 0; f < files.size(); ++f) {
    std::string name = files[f].at("file").as_string();
    std::string p = path_ + "/" + name;
    files_.push_back(p);
    if (!fs::exists(p)) {
      problems.push_back(name + " is missing");
      continue;
    }
    int64_t want = files[f].at("bytes").as_int();
    int64_t have = static_cast<int64_t>(fs::file_size(p));
    if (want != have)
      problems.push_back(name + " has " + std::to_string(have) + " bytes, the index says " + std::to_string(want) +
                         " (truncated or rewritten)");
    for (const auto& s : files[f].at("slices").as_array())
      slices_.push_back({static_cast<int>(f), s[0].as_string(), s[1].as_int(), s[2].as_int(), s[3].as_int()});
  }
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "; ") + p;
    EASYCTX_THROW_INPUT("checkpoint ", path_, ": ", msg);
  }
}

int64_t CheckpointReader::numel(const std::string& name) const {
  for (const auto& s : slices_)
    if (s.name == name) return s.global_numel;
  EASYCTX_THROW_INPUT("checkpoint ", path_, " has no array '", name, "' (written by an incompatible model?)");
}

void CheckpointReader::read(const std::string& name, int64_t offset, int64_t length, float* out) const {
  h5::quiet_errors();
  int64_t gn = numel(name);
  EASYCTX_CHECK_INPUT(offset >= 0 && offset + length <= gn, "checkpoint ", path_, ": range [", offset, ", ",
                      offset + length, ") of '", name, "' outside its ", gn, " elements");
  int64_t covered = 0;
  for (const auto& s : slices_) {
    if (s.name != name) continue;
    int64_t lo = std::max(offset, s.offset), hi = std::min(offset + length, s.offset + s.length);
    if (lo >= hi) continue;
    covered += hi - lo;
    // Index of this slice inside its file: count earlier slices of the same file.
    size_t idx = 0;
    for (const auto& t : slices_) {
      if (&t == &s) break;
      if (t.file == s.file) ++idx;
    }
    const std::string& path = files_[static_cast<size_t>(s.file)];
    h5::Handle f = h5::open_file(path, false);
    std::string ds_name = "slice_" + std::to_string(idx);
    h5::Handle ds = h5::open_dataset(f, ds_name.c_str(), path);
    h5::read_1d(ds, H5T_NATIVE_FLOAT, static_cast<uint64_t>(lo - s.offset), static_cast<uint64_t>(hi - lo),
                out + (lo - offset), ds_name.c_str(), path);
    bytes_read_ += static_cast<uint64_t>(hi - lo) * sizeof(float);
  }
  EASYCTX_CHECK_INPUT(covered == length, "checkpoint ", path_, ": the files hold only ", covered, " of the ", length,
                      " elements requested from '", name, "'");
}

Json CheckpointReader::rank_meta(int rank) const {
  h5::quiet_errors();
  EASYCTX_CHECK_INPUT(rank >= 0 && rank < world_size(), "checkpoint ", path_, " has no rank ", rank);
  const std::string& path = files_[static_cast<size_t>(rank)];
  h5::Handle f = h5::open_file(path, false);
  return parse_json(h5::read_attr_string(f, "rank_meta", path), path + ":rank_meta");
}

std::string CheckpointReader::run_id() const {
  const Json* r = index_.find("run_id");
  return r && r->is_string() ? r->as_string() : "";
}

std::string CheckpointReader::config_hash() const {
  const Json* h = index_.find("config_hash");
  return h && h->is_string() ? h->as_string() : "";
}

namespace {
std::atomic<uint64_t> g_verified_files{0}, g_verified_datasets{0}, g_verified_bytes{0};
}  // namespace

uint64_t verified_file_count() { return g_verified_files.load(); }
uint64_t verified_dataset_count() { return g_verified_datasets.load(); }
uint64_t verified_byte_count() { return g_verified_bytes.load(); }

void CheckpointReader::verify_files(int first, int stride, VerifyScope scope) const {
  h5::quiet_errors();
  const bool everything = scope == VerifyScope::Everything;
  const auto& files = index_.at("files").as_array();
  for (size_t fi = static_cast<size_t>(first); fi < files.size(); fi += static_cast<size_t>(stride)) {
    const std::string& path = files_[fi];
    g_verified_files.fetch_add(1);
    h5::Handle f = h5::open_file(path, false);
    const auto& sl = files[fi].at("slices").as_array();
    for (size_t i = 0; i < sl.size(); ++i) {
      if (!everything && !is_weight_array(sl[i][0].as_string())) continue;  // (not read by this consumer)
      verify_dataset(f, i, sl[i], path);
      g_verified_datasets.fetch_add(1);
      g_verified_bytes.fetch_add(static_cast<uint64_t>(sl[i][3].as_int()) * sizeof(float));
    }
    if (!everything) continue;  // (the rank state is read by a resume only)
    const std::string rank_meta = h5::read_attr_string(f, "rank_meta", path);
    if (const Json* c = files[fi].find("rank_meta_crc"))
      EASYCTX_CHECK_INPUT(static_cast<int64_t>(crc_of_bytes(rank_meta.data(), rank_meta.size())) == c->as_int(), path,
                          ": rank_meta (this rank's data cursor) fails its checksum: the file is corrupt");
  }
}

std::string verify_collectively(RankSync& sync, const std::string& path, CheckpointRef* ref, VerifyScope scope) {
  std::string err;
  try {
    const CheckpointReader r(path);
    r.verify_files(sync.rank(), sync.size(), scope);
    if (ref) *ref = {r.path(), r.step()};
  } catch (const std::exception& e) { err = e.what(); }
  return sync.reduce(err, "verifying its share of " + path, "collecting the verification",
                     [](const std::vector<std::string>& all) {
                       for (const std::string& e : all)
                         if (!e.empty()) return e;
                       return std::string();
                     });
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const int64_t step = step_of_dir(e.path().filename().string());
    if (step < 0 || !fs::exists(e.path() / kCommitted)) continue;
    CheckpointEntry c;
    c.path = e.path().string();
    c.step = step;
    try {
      c.run_id = index_run_id(c.path);
    } catch (const std::exception& x) { c.problem = x.what(); }
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step > b.step; });
  return out;
}

CheckpointRef find_latest_checkpoint(const std::string& root, std::vector<std::string>* warnings) {
  CheckpointRef none;
  if (!fs::is_directory(root)) return none;
  for (const CheckpointEntry& c : list_checkpoints(root)) {
    const std::string& path = c.path;
    const int64_t step = c.step;
    try {
      CheckpointReader r(path);
      r.verify();
      return {path, step};
    } catch (const std::exception& e) {
      if (warnings)
        warnings->push_back("checkpoint " + path + " is broken (" + e.what() + "); falling back to the previous one");
    }
  }
  return none;
}

}  // namespace easyctx::ckpt
