#include "ckpt/sharded_checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

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

uint32_t crc_of(const float* p, int64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* b = reinterpret_cast<const Bytef*>(p);
  size_t left = static_cast<size_t>(n) * sizeof(float);
  while (left > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, b, chunk);
    b += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string rank_file_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.h5", r);
  return buf;
}

void fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  EASYCTX_CHECK(fd >= 0, "cannot open ", p, " to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  EASYCTX_CHECK(rc == 0, "fsync of ", p, " failed: ", std::strerror(errno));
}

// Test hook: EASYCTX_CKPT_CRASH=<point>[:<rank>] kills this process (SIGKILL, no cleanup)
// at a named point of the save, so tests can prove a crash there loses nothing committed.
void maybe_crash(const char* point, int rank) {
  const char* env = std::getenv("EASYCTX_CKPT_CRASH");
  if (!env) return;
  std::string spec = env;
  std::string want = spec, who;
  size_t colon = spec.find(':');
  if (colon != std::string::npos) {
    want = spec.substr(0, colon);
    who = spec.substr(colon + 1);
  }
  if (want != point) return;
  if (!who.empty() && std::atoi(who.c_str()) != rank) return;
  std::fprintf(stderr, "EASYCTX_CKPT_CRASH: killing rank %d at '%s'\n", rank, point);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

// Every rank reports success; if any failed, every rank throws (the failing one its own
// message) so nobody waits in a barrier for a dead peer.
void agree(MPI_Comm comm, const std::string& err, const std::string& what) {
  int bad = err.empty() ? 0 : 1, any = 0;
  dist::check_mpi(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce(checkpoint status)");
  if (!err.empty()) EASYCTX_THROW(err);
  if (any) EASYCTX_THROW(what, " failed on another rank (see its message); the previous checkpoint is intact");
}

int64_t step_of_dir(const std::string& name) {
  if (!starts_with(name, "step-") || ends_with(name, ".tmp")) return -1;
  std::string digits = name.substr(5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

void write_dataset(const h5::Handle& f, const std::string& ds_name, const float* data, int64_t n,
                   const std::string& path) {
  hsize_t dims[1] = {static_cast<hsize_t>(n)};
  h5::Handle space(H5Screate_simple(1, dims, nullptr), h5::Handle::Kind::Dataspace, "H5Screate_simple", path);
  h5::Handle ds(H5Dcreate2(f, ds_name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                h5::Handle::Kind::Dataset, "H5Dcreate2", path);
  h5::check(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", path);
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

CheckpointWriter::CheckpointWriter(MPI_Comm comm, std::string root, int64_t step)
    : comm_(comm), root_(std::move(root)), step_(step) {
  dist::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  dist::check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

void CheckpointWriter::add(const std::string& name, int64_t global_numel, int64_t offset, const float* data,
                           int64_t length) {
  EASYCTX_CHECK(offset >= 0 && length >= 0 && offset + length <= global_numel, "checkpoint slice ", name, " [",
                offset, ", ", offset + length, ") outside [0, ", global_numel, ")");
  if (length > 0) slices_.push_back({name, global_numel, offset, length, data});
}

std::string CheckpointWriter::commit(const Json& meta, int64_t keep_last) {
  h5::quiet_errors();
  const std::string tmp = root_ + "/" + step_dir_name(step_) + ".tmp";
  const std::string final_dir = root_ + "/" + step_dir_name(step_);
  std::string err;
  if (rank_ == 0) {
    try {
      fs::create_directories(root_);
      fs::remove_all(tmp);  // a crashed earlier attempt at this step
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      err = std::string("cannot create checkpoint folder ") + tmp + ": " + e.what();
    }
  }
  agree(comm_, err, "creating " + tmp);

  // 1. Every rank writes and syncs its own file.
  const std::string file = tmp + "/" + rank_file_name(rank_);
  Json listing = Json::array();
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
      h5::write_attr_string(f, "rank_meta", rank_meta_.dump(), file);
      h5::write_attr_int(f, "step", step_, file);
      h5::write_attr_int(f, "rank", rank_, file);
      h5::check(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush", file);
    }
    fsync_path(file, false);
  } catch (const std::exception& e) {
    err = e.what();
  }
  maybe_crash("rank_file", rank_);
  agree(comm_, err, "writing checkpoint step " + std::to_string(step_));

  // 2. Rank 0 gathers every file's listing and size.
  Json mine = Json::object();
  mine.set("file", rank_file_name(rank_));
  mine.set("bytes", static_cast<int64_t>(fs::file_size(file)));
  mine.set("slices", listing);
  std::string text = mine.dump();
  int len = static_cast<int>(text.size());
  std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  dist::check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_), "MPI_Gather");
  std::string all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += lens[static_cast<size_t>(r)];
    }
    all.resize(static_cast<size_t>(total));
  }
  dist::check_mpi(MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, comm_),
                  "MPI_Gatherv");

  // 3. Rank 0 writes the index, commits, moves `latest`, prunes.
  if (rank_ == 0) {
    try {
      Json index = Json::object();
      index.set("format", "easyctx-checkpoint-1");
      index.set("step", step_);
      index.set("world_size", size_);
      index.set("meta", meta);
      Json files = Json::array();
      for (int r = 0; r < size_; ++r)
        files.push_back(parse_json(std::string_view(all).substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                                                                static_cast<size_t>(lens[static_cast<size_t>(r)])),
                                   "rank listing"));
      index.set("files", files);
      write_file_atomic(tmp + "/index.json", index.dump(1));
      fsync_path(tmp + "/index.json", false);
      fsync_path(tmp, true);
      maybe_crash("before_commit", rank_);
      fs::remove_all(final_dir);  // an uncommitted leftover of the same step
      fs::rename(tmp, final_dir);
      write_file_atomic(final_dir + "/" + kCommitted, std::to_string(step_) + "\n");
      fsync_path(final_dir, true);
      fsync_path(root_, true);
      maybe_crash("before_latest", rank_);
      write_file_atomic(root_ + "/latest", step_dir_name(step_) + "\n");
      fsync_path(root_, true);
      // Prune committed steps beyond keep_last and stale temporary folders.
      std::vector<std::pair<int64_t, std::string>> steps;
      for (const auto& e : fs::directory_iterator(root_)) {
        std::string n = e.path().filename().string();
        if (ends_with(n, ".tmp") && n != step_dir_name(step_) + ".tmp") {
          fs::remove_all(e.path());
          continue;
        }
        int64_t s = step_of_dir(n);
        if (s >= 0 && fs::exists(e.path() / kCommitted)) steps.emplace_back(s, e.path().string());
      }
      std::sort(steps.rbegin(), steps.rend());
      for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 1)); i < steps.size(); ++i)
        fs::remove_all(steps[i].second);
    } catch (const std::exception& e) {
      err = std::string("committing checkpoint step ") + std::to_string(step_) + ": " + e.what();
    }
  }
  agree(comm_, err, "committing checkpoint step " + std::to_string(step_));
  return final_dir;
}

// ---------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  EASYCTX_CHECK_INPUT(fs::is_directory(path_), "checkpoint ", path_, ": no such folder");
  EASYCTX_CHECK_INPUT(fs::exists(path_ + "/" + kCommitted), "checkpoint ", path_,
                      ": not committed (no COMMITTED marker; the save was interrupted)");
  index_ = parse_json(read_file(path_ + "/index.json"), path_ + "/index.json");
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
    if (want != have) problems.push_back(name + " has " + std::to_string(have) + " bytes, the index says " + std::to_string(want) + " (truncated or rewritten)");
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

void CheckpointReader::verify() const {
  h5::quiet_errors();
  const auto& files = index_.at("files").as_array();
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const std::string& path = files_[fi];
    h5::Handle f = h5::open_file(path, false);
    const auto& sl = files[fi].at("slices").as_array();
    for (size_t i = 0; i < sl.size(); ++i) {
      std::string ds_name = "slice_" + std::to_string(i);
      h5::Handle ds = h5::open_dataset(f, ds_name.c_str(), path);
      int64_t n = sl[i][3].as_int();
      EASYCTX_CHECK_INPUT(static_cast<int64_t>(h5::dataset_length(ds, ds_name.c_str(), path)) == n, path, ": ",
                          ds_name, " (", sl[i][0].as_string(), ") has the wrong length");
      std::vector<float> buf(static_cast<size_t>(n));
      h5::read_1d(ds, H5T_NATIVE_FLOAT, 0, static_cast<uint64_t>(n), buf.data(), ds_name.c_str(), path);
      EASYCTX_CHECK_INPUT(static_cast<int64_t>(crc_of(buf.data(), n)) == sl[i][4].as_int(), path, ": ", ds_name, " (",
                          sl[i][0].as_string(), ") fails its checksum: the file is corrupt");
    }
    h5::read_attr_string(f, "rank_meta", path);
  }
}

CheckpointRef find_latest_checkpoint(const std::string& root, std::vector<std::string>* warnings) {
  CheckpointRef none;
  if (!fs::is_directory(root)) return none;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    int64_t s = step_of_dir(e.path().filename().string());
    if (s >= 0 && fs::exists(e.path() / kCommitted)) steps.emplace_back(s, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& [step, path] : steps) {
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
