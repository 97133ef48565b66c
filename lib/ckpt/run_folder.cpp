#include "ckpt/run_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "ckpt/rank_sync.h"
#include "core/error.h"
#include "core/strings.h"

namespace fs = std::filesystem;

namespace easyctx::ckpt {
namespace {

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// write_file_atomic with a temporary name of this process's own: ranks that each run a
// one-rank trainer in the same folder (tests do) never rename each other's file away.
void write_atomic_private(const fs::path& path, const std::string& content) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  write_file_atomic(tmp.string(), content);
  fs::rename(tmp, path);
}

// Moves `from` to `to` when it exists and `to` does not (an earlier, interrupted archive may
// have moved it already).
void move_if_there(const fs::path& from, const fs::path& to) {
  if (!fs::exists(from) || fs::exists(to)) return;
  fs::create_directories(to.parent_path());
  fs::rename(from, to);
}

}  // namespace

std::string new_run_id() {
  std::random_device rd;
  uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  x ^= static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  x ^= static_cast<uint64_t>(::getpid()) << 17;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Json run_info_to_json(const RunInfo& info) {
  Json j = Json::object();
  j.set("format", "easyctx-run-1");
  j.set("run_id", info.run_id);
  j.set("config_hash", info.config_hash);
  j.set("started", info.started);
  if (info.adopts_unlabelled) j.set("adopts_unlabelled", true);
  j.set("origin", info.origin.is_null() ? Json::object() : info.origin);
  if (!info.archive_of.empty()) {
    j.set("archive_of", info.archive_of);
    j.set("archive_info", info.archive_info);
    j.set("archive_keeps_metrics", info.archive_keeps_metrics);
  }
  Json e = Json::array();
  for (const std::string& id : info.earlier_runs) e.push_back(id);
  j.set("earlier_runs", e);
  return j;
}

RunInfo run_info_from_json(const Json& j, const std::string& source) {
  EASYCTX_CHECK_INPUT(
      j.is_object() && j.find("run_id") && j.at("run_id").is_string() && !j.at("run_id").as_string().empty(), source,
      ": not an easyctx run record (a non-empty run_id expected)");
  RunInfo info;
  info.run_id = j.at("run_id").as_string();
  if (const Json* h = j.find("config_hash"); h && h->is_string()) info.config_hash = h->as_string();
  if (const Json* s = j.find("started"); s && s->is_string()) info.started = s->as_string();
  if (const Json* a = j.find("adopts_unlabelled"); a && a->is_bool()) info.adopts_unlabelled = a->as_bool();
  if (const Json* o = j.find("origin")) info.origin = *o;
  if (const Json* a = j.find("archive_of"); a && a->is_string()) info.archive_of = a->as_string();
  if (const Json* a = j.find("archive_info")) info.archive_info = *a;
  if (const Json* k = j.find("archive_keeps_metrics"); k && k->is_bool()) info.archive_keeps_metrics = k->as_bool();
  if (const Json* e = j.find("earlier_runs"); e && e->is_array())
    for (const Json& id : e->as_array())
      if (id.is_string()) info.earlier_runs.push_back(id.as_string());
  return info;
}

std::optional<RunInfo> read_run_info(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / "run.json").string();
  if (!fs::exists(path)) return std::nullopt;
  Json j;
  try {
    j = parse_json(read_file(path), path);
  } catch (const std::exception& e) {
    EASYCTX_THROW_INPUT(path, ": unreadable (", e.what(),
                        "); it names the run this folder holds: restore it, or "
                        "remove it to let --resume auto pick the newest valid checkpoint");
  }
  return run_info_from_json(j, path);
}

void write_run_info(const std::string& run_dir, const RunInfo& info) {
  fs::create_directories(run_dir);
  const std::string path = (fs::path(run_dir) / "run.json").string();
  write_atomic_private(path, run_info_to_json(info).dump(1) + "\n");
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    EASYCTX_CHECK(rc == 0, "fsync of ", path, " failed: ", std::strerror(e));
  }
  fsync_dir(run_dir);
}

bool belongs_to(const std::string& ckpt_run_id, const RunInfo& run) {
  return ckpt_run_id == run.run_id || (ckpt_run_id.empty() && run.adopts_unlabelled);
}

std::vector<CheckpointEntry> checkpoint_candidates(const std::string& spec, std::string* note) {
  std::string dir = spec;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (fs::exists(fs::path(dir) / "index.json") || fs::exists(fs::path(dir) / "COMMITTED")) {
    CheckpointEntry e;
    e.path = dir;
    e.step = step_of_dir(fs::path(dir).filename().string());
    for (const CheckpointEntry& l : list_checkpoints(fs::path(dir).parent_path().string()))
      if (fs::path(l.path).filename() == fs::path(dir).filename()) e = l;
    e.path = dir;
    return {e};
  }
  const fs::path ckdir = fs::path(dir) / "checkpoints";
  std::vector<CheckpointEntry> all = list_checkpoints(fs::is_directory(ckdir) ? ckdir.string() : dir);
  const std::optional<RunInfo> run = read_run_info(dir);
  if (!run) return all;
  std::vector<CheckpointEntry> mine;
  std::string others;
  for (const CheckpointEntry& e : all) {
    if (belongs_to(e.run_id, *run)) {
      mine.push_back(e);
    } else {
      others += (others.empty() ? "" : ", ") + fs::path(e.path).filename().string() +
                (e.problem.empty() ? " (run " + (e.run_id.empty() ? std::string("unlabelled") : e.run_id) + ")"
                                   : " (unreadable)");
    }
  }
  if (note && !others.empty())
    *note =
        "checkpoints of other runs than " + dir + "/run.json's run " + run->run_id + " are not considered: " + others;
  return mine;
}

CheckpointRef resolve_verified(const std::string& spec, std::vector<std::string>* warnings, VerifyScope scope) {
  std::string note;
  const std::vector<CheckpointEntry> cands = checkpoint_candidates(spec, &note);
  if (!note.empty() && warnings) warnings->push_back(note);
  std::string broken;
  for (const CheckpointEntry& c : cands) {
    try {
      const CheckpointReader r(c.path);
      r.verify(scope);
      return {r.path(), r.step()};
    } catch (const std::exception& e) {
      broken += std::string(broken.empty() ? "" : "; ") + e.what();
      if (warnings && cands.size() > 1)
        warnings->push_back("checkpoint " + c.path + " is broken (" + e.what() + "); trying the previous one");
    }
  }
  if (!cands.empty()) EASYCTX_THROW_INPUT(spec, ": no checkpoint there passes verification: ", broken);
  return {};
}

CheckpointRef resolve_verified(RankSync& sync, const std::string& spec, std::vector<std::string>* warnings,
                               VerifyScope scope) {
  // Rank 0's listing, as JSON: {"paths": [...], "note": ...} or {"error": ..., "input": bool}
  // (an error while listing ends every rank alike, as the same exception type).
  std::string listing;
  if (sync.rank() == 0) {
    Json j = Json::object();
    try {
      std::string note;
      Json paths = Json::array();
      for (const CheckpointEntry& c : checkpoint_candidates(spec, &note)) paths.push_back(c.path);
      j.set("paths", std::move(paths));
      j.set("note", note);
    } catch (const InputError& e) {
      j.set("error", std::string(e.what()));
      j.set("input", true);
    } catch (const std::exception& e) {
      j.set("error", std::string(e.what()));
      j.set("input", false);
    }
    listing = j.dump();
  }
  const Json got = parse_json(sync.bcast(listing, "listing the checkpoints of " + spec), "rank 0's checkpoint listing");
  if (const Json* err = got.find("error")) {
    if (got.at("input").as_bool()) EASYCTX_THROW_INPUT(err->as_string());
    EASYCTX_THROW(err->as_string());
  }
  const std::string note = got.at("note").as_string();
  if (!note.empty() && warnings) warnings->push_back(note);
  std::vector<std::string> paths;
  for (const Json& c : got.at("paths").as_array()) paths.push_back(c.as_string());
  std::vector<std::string> problems;
  CheckpointRef ref;
  const int chosen = first_verified(sync, paths, &problems, &ref, scope);
  for (size_t i = 0; warnings && paths.size() > 1 && i < problems.size(); ++i)
    warnings->push_back("checkpoint " + paths[i] + " is broken (" + problems[i] + "); trying the previous one");
  if (chosen < 0 && !paths.empty())
    EASYCTX_THROW_INPUT(spec, ": no checkpoint there passes verification: ", join(problems, "; "));
  return ref;
}

int first_verified(RankSync& sync, const std::vector<std::string>& paths, std::vector<std::string>* problems,
                   CheckpointRef* ref, VerifyScope scope) {
  for (size_t i = 0; i < paths.size(); ++i) {
    // The same verdict on every rank: "" or the first problem found (naming file and dataset).
    const std::string problem = verify_collectively(sync, paths[i], ref, scope);
    if (problem.empty()) return static_cast<int>(i);
    problems->push_back(problem);
  }
  return -1;
}

void archive_run(const std::string& run_dir, const std::string& old_id, const Json& info, bool keep_metrics) {
  const fs::path dir(run_dir), dest = fs::path(run_dir) / "previous" / old_id;
  fs::create_directories(dest);
  if (!info.is_null() && !fs::exists(dest / "run.json")) write_atomic_private(dest / "run.json", info.dump(1) + "\n");
  move_if_there(dir / "DONE", dest / "DONE");
  move_if_there(dir / "final", dest / "final");
  move_if_there(dir / "plan.json", dest / "plan.json");
  if (fs::exists(dir / "metrics.jsonl") && !fs::exists(dest / "metrics.jsonl")) {
    if (keep_metrics) {
      fs::copy_file(dir / "metrics.jsonl", dest / "metrics.jsonl.tmp", fs::copy_options::overwrite_existing);
      fs::rename(dest / "metrics.jsonl.tmp", dest / "metrics.jsonl");
    } else {
      fs::rename(dir / "metrics.jsonl", dest / "metrics.jsonl");
    }
  }
  // The TensorBoard folder goes the same way: a new run's curves never merge with the earlier
  // run's; a fork keeps the history it continues (its first event drops the steps after the
  // fork in TensorBoard).
  if (fs::exists(dir / "tensorboard") && !fs::exists(dest / "tensorboard")) {
    if (keep_metrics) {
      fs::remove_all(dest / "tensorboard.tmp");
      fs::copy(dir / "tensorboard", dest / "tensorboard.tmp", fs::copy_options::recursive);
      fs::rename(dest / "tensorboard.tmp", dest / "tensorboard");
    } else {
      fs::rename(dir / "tensorboard", dest / "tensorboard");
    }
  }
  fsync_dir(dest.string());
  fsync_dir(run_dir);
}

}  // namespace easyctx::ckpt
