// Fault injection against easyctx_train and easyctx_convert (mpirun -np 2, CPU, the tiny
// model, 12 steps of 2 x 32 tokens, a checkpoint every 4 steps): kills (SIGKILL) and stop
// requests (SIGTERM, SIGUSR1) at every point of a save and of the start-up, stalled ranks, full
// disks, corrupt and foreign checkpoints, non-finite losses. The faults come from the
// EASYCTX_FAULT hook (ckpt/sharded_checkpoint.h: fault_point), a per-rank file-size limit
// (RLIMIT_FSIZE: writes fail with EFBIG) and, where unprivileged namespaces are allowed, a
// small tmpfs (ENOSPC). Every case asserts one of:
//   nothing lost: `--resume auto` until DONE ends with the uninterrupted run's final weights
//     (final/model.safetensors, f32) and metrics.jsonl (every step once; wall-clock fields
//     aside), bit for bit, and no checkpoint of the run was lost on the way;
//   a clean error: a non-zero exit with a message naming the rank, file, dataset or step, in
//     bounded time, and nothing in the run folder changed or deleted.
// Each case prints "FAULT-SUMMARY | class | case | outcome | seconds" (the table of
// docs/reliability.md; seconds: from the fault to the exit for stalls, else the faulted run).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/run_folder.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/json.h"
#include "core/tensorboard.h"
#include "core/strings.h"
#include "dist/comm_mpi.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace easyctx::test {
namespace {

using Clock = std::chrono::steady_clock;

void summary(const std::string& cls, const std::string& name, const std::string& outcome, double seconds) {
  std::printf("FAULT-SUMMARY | %s | %s | %s | %.1f\n", cls.c_str(), name.c_str(), outcome.c_str(), seconds);
  std::fflush(stdout);
}

struct Result {
  int rc = -1;
  double seconds = 0;       // the whole command
  double after_fault = -1;  // from the first "EASYCTX_FAULT:" line to the exit (-1: none)
  std::string out;
};

// Runs `cmd` (sh), stdout and stderr merged, timing the exit from the fault hook's line.
Result run_cmd(const std::string& cmd) {
  Result r;
  const auto t0 = Clock::now();
  Clock::time_point fault{};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    if (fault == Clock::time_point{} && std::strstr(buf, "EASYCTX_FAULT:")) fault = Clock::now();
    r.out += buf;
  }
  const int st = pclose(p);
  const auto t1 = Clock::now();
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  if (fault != Clock::time_point{}) r.after_fault = std::chrono::duration<double>(t1 - fault).count();
  return r;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string slurp(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec) ? read_file(path) : std::string();
}

// metrics.jsonl without the wall-clock fields.
std::vector<std::string> metrics_of(const std::string& run) {
  std::vector<std::string> out;
  for (const std::string& line : split(slurp(run + "/metrics.jsonl"), '\n')) {
    if (line.empty()) continue;
    const Json j = parse_json(line, run + "/metrics.jsonl");
    out.push_back(without_wall_clock(j));
  }
  return out;
}

// This run's committed checkpoints (run.json's id), steps newest first.
std::vector<int64_t> run_steps(const std::string& run) {
  std::vector<int64_t> steps;
  const auto info = ckpt::read_run_info(run);
  for (const ckpt::CheckpointEntry& e : ckpt::list_checkpoints(run + "/checkpoints"))
    if (info && ckpt::belongs_to(e.run_id, *info)) steps.push_back(e.step);
  return steps;
}

class Faults : public ::testing::Test {
 protected:
  static constexpr int kSteps = 12;

  void SetUp() override {
    dir_ = std::make_unique<TempDir>("faults");
    write_walk_shard(*dir_ / "shard.h5", 20260101, 60, 20, 90, 256);
    stage_ = *dir_ / "stage.yaml";
    write_file_atomic(stage_, stage_yaml(2));
    straight_ = *dir_ / "straight";
    const Result r = train(straight_);
    ASSERT_EQ(r.rc, 0) << r.out;
    ASSERT_TRUE(fs::exists(straight_ + "/final/model.safetensors"));
    ASSERT_EQ(metrics_of(straight_).size(), static_cast<size_t>(kSteps));
  }

  std::string stage_yaml(int keep_last) const {
    return "model: {config: tiny}\n"
           "data: {path: " +
           *dir_ / "shard.h5" +
           ", seq_length: 32}\n"
           "train: {device: cpu, steps: " +
           std::to_string(kSteps) +
           ", batch_size: 2, lr: 3.0e-3, schedule: cosine, "
           "warmup_steps: 2}\n"
           "parallel: {collective_timeout_s: 60}\n"
           "activation: {checkpoint: layer}\n"
           "output: {save_every: 4, keep_last: " +
           std::to_string(keep_last) +
           ", hf_dtype: f32}\n"
           "logging: {every: 1}\n";
  }

  struct Opts {
    std::string env;    // "K=V K2=V2"
    std::string args;   // more easyctx_train arguments
    std::string wrap;   // a shell snippet run before exec on every rank ("$OMPI_COMM_WORLD_RANK" is set)
    std::string stage;  // another stage YAML
    int np = 2;
    int timeout_s = 120;
  };

  std::string mpirun(const Opts& o) const {
    return std::string("env -i PATH=\"$PATH\" HOME=\"$HOME\" OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ") + o.env +
           " timeout " + std::to_string(o.timeout_s) + " " + EASYCTX_MPIEXEC + " -np " + std::to_string(o.np) +
           " --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none " +
           (o.wrap.empty() ? "" : "bash -c '" + o.wrap + "; exec \"$0\" \"$@\"' ");
  }

  static Opts opts(const std::string& env, const std::string& args) {
    Opts o;
    o.env = env;
    o.args = args;
    return o;
  }
  Result train(const std::string& out) const { return train(out, Opts()); }
  Result train(const std::string& out, const Opts& o) const {
    return run_cmd(mpirun(o) + bin_dir() + "/easyctx_train " + (o.stage.empty() ? stage_ : o.stage) +
                   " --set output.dir=" + out + " " + o.args);
  }

  // --resume auto until the stage is DONE (each run may also be stopped by a signal hook that
  // is no longer set); then the same final weights and metrics as the uninterrupted run.
  void finish_and_compare(const std::string& out, const std::string& what) {
    for (int i = 0; i < 3 && !fs::exists(out + "/DONE"); ++i) {
      const Result r = train(out);
      ASSERT_EQ(r.rc, 0) << what << ": the resumed run failed:\n" << r.out;
    }
    ASSERT_TRUE(fs::exists(out + "/DONE")) << what;
    EXPECT_EQ(slurp(out + "/final/model.safetensors"), slurp(straight_ + "/final/model.safetensors"))
        << what << ": the final weights differ from the uninterrupted run's";
    EXPECT_EQ(metrics_of(out), metrics_of(straight_)) << what << ": metrics.jsonl differs from the uninterrupted run's";
  }

  std::string path(const std::string& n) const { return *dir_ / n; }

  std::unique_ptr<TempDir> dir_;
  std::string stage_, straight_;
};

// ---- kills and stop requests at every point of a save ---------------------------------

struct SavePoint {
  const char* spec;              // EASYCTX_FAULT without the action
  int64_t committed_after_kill;  // the run's newest checkpoint a kill there leaves
};
// The second save (step 8) of the run; rank 1 or rank 0 where it matters.
const SavePoint kSavePoints[] = {
    {"start@8:1", 4},        {"rank_file@8:1", 4},     {"rank_file@8:0", 4},    {"before_commit@8:0", 4},
    {"after_rename@8:0", 4}, {"before_latest@8:0", 8}, {"before_prune@8:0", 8}, {"after_prune@8:0", 8},
    {"recorded@8:1", 4},     {"recorded@8:0", 4},
};

TEST_F(Faults, KillDuringSave) {
  for (const SavePoint& p : kSavePoints) {
    const std::string out = path(std::string("kill-") + p.spec);
    Opts o;
    o.env = std::string("EASYCTX_FAULT=") + p.spec + ":kill";
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << p.spec << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "EASYCTX_FAULT: kill")) << p.spec << "\n" << r.out;
    const std::vector<int64_t> steps = run_steps(out);
    ASSERT_FALSE(steps.empty()) << p.spec;
    EXPECT_EQ(steps.front(), p.committed_after_kill) << p.spec;
    EXPECT_EQ(ckpt::resolve_verified(out, nullptr).step, p.committed_after_kill) << p.spec;
    finish_and_compare(out, std::string("kill -9 at ") + p.spec);
    summary("kill -9 during a save", p.spec, HasFailure() ? "FAILED" : "nothing lost", r.seconds);
  }
}

// A stop request (the signal handler's flag) at each point: the run commits a checkpoint at the
// next step boundary and exits 0. keep_last 1, so a stop right after a save that deleted the
// committed copy to save the same step again would leave nothing.
TEST_F(Faults, StopRequestDuringSave) {
  const std::string stage1 = path("stage-keep1.yaml");
  write_file_atomic(stage1, stage_yaml(1));
  // (the flag is only read at the next step boundary, so a few points of the save suffice)
  const SavePoint points[] = {kSavePoints[0], kSavePoints[1], kSavePoints[3],
                              kSavePoints[5], kSavePoints[7], kSavePoints[9]};
  int i = 0;
  for (const SavePoint& p : points) {
    const char* sig = (i++ % 2) ? "usr1" : "term";
    const std::string out = path(std::string("stop-") + sig + "-" + p.spec);
    Opts o;
    o.stage = stage1;
    o.env = std::string("EASYCTX_FAULT=") + p.spec + ":" + sig;
    const Result r = train(out, o);
    EXPECT_EQ(r.rc, 0) << p.spec << " " << sig << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "stop requested")) << p.spec << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out + "/DONE")) << p.spec;
    // The stop comes at the boundary right after the periodic save of step 8: that checkpoint
    // is kept, not deleted to be written again.
    EXPECT_EQ(run_steps(out), std::vector<int64_t>{8}) << p.spec << " (keep_last 1)";
    EXPECT_TRUE(has(r.out, "already committed")) << p.spec << "\n" << r.out;
    // Resume with the same keep_last 1 stage.
    for (int k = 0; k < 3 && !fs::exists(out + "/DONE"); ++k) {
      Opts f;
      f.stage = stage1;
      const Result c = train(out, f);
      ASSERT_EQ(c.rc, 0) << c.out;
    }
    EXPECT_EQ(slurp(out + "/final/model.safetensors"), slurp(straight_ + "/final/model.safetensors")) << p.spec;
    EXPECT_EQ(metrics_of(out), metrics_of(straight_)) << p.spec;
    summary(std::string("SIG") + (std::string(sig) == "term" ? "TERM" : "USR1") + " during a save", p.spec,
            HasFailure() ? "FAILED" : "nothing lost", r.seconds);
  }
}

// ---- start-up ---------------------------------------------------------------------------

TEST_F(Faults, FaultsAtStartup) {
  // A run stopped after step 6 (its checkpoint of step 4 committed), then each start-up point
  // of its resumption, and of a --resume none start beside it.
  const std::string base = path("startup-base");
  {
    Opts o;
    o.env = "EASYCTX_FAULT=recorded@6:0:kill";
    ASSERT_NE(train(base, o).rc, 0);
    ASSERT_EQ(run_steps(base), std::vector<int64_t>{4});
  }
  const char* resume_points[] = {"startup:1:kill", "startup:0:kill", "started:0:kill",
                                 "startup:1:term", "started:1:usr1", "started:0:term"};
  for (const char* spec : resume_points) {
    const std::string out = path(std::string("startup-") + spec);
    fs::copy(base, out, fs::copy_options::recursive);
    Opts o;
    o.env = std::string("EASYCTX_FAULT=") + spec;
    const Result r = train(out, o);
    const bool stop = !has(std::string(spec), "kill");
    if (stop) {
      EXPECT_EQ(r.rc, 0) << spec << "\n" << r.out;
      EXPECT_TRUE(has(r.out, "already committed")) << spec << ": the resumed step is not saved again\n" << r.out;
    } else {
      EXPECT_NE(r.rc, 0) << spec << "\n" << r.out;
    }
    EXPECT_EQ(run_steps(out), std::vector<int64_t>{4}) << spec;
    finish_and_compare(out, std::string("resumed run, fault ") + spec);
    summary(stop ? "stop request at start-up (resume)" : "kill -9 at start-up (resume)", spec,
            HasFailure() ? "FAILED" : "nothing lost", r.seconds);
  }
  // --resume none beside the stopped run: killed while it records itself; a requeue
  // (--resume auto) continues the new run (from model.init, it has no checkpoint yet).
  for (const char* spec : {"run_json:0:kill", "archived:0:kill", "started:1:kill"}) {
    const std::string out = path(std::string("none-") + spec);
    fs::copy(base, out, fs::copy_options::recursive);
    const auto old = ckpt::read_run_info(out);
    Opts o;
    o.env = std::string("EASYCTX_FAULT=") + spec;
    o.args = "--resume none";
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << spec << "\n" << r.out;
    const auto now = ckpt::read_run_info(out);
    ASSERT_TRUE(now && old);
    EXPECT_NE(now->run_id, old->run_id) << spec << ": run.json names the new run before anything else happens";
    finish_and_compare(out, std::string("--resume none killed at ") + spec + ", then --resume auto");
    // The earlier run's checkpoint of step 4 was set aside when the new run saved step 4,
    // never deleted; its metrics are kept under previous/.
    EXPECT_TRUE(fs::exists(out + "/previous/" + old->run_id + "/checkpoints/step-00000004/COMMITTED")) << spec;
    EXPECT_TRUE(fs::exists(out + "/previous/" + old->run_id + "/metrics.jsonl")) << spec;
    summary("kill -9 at start-up (--resume none)", spec, HasFailure() ? "FAILED" : "nothing lost", r.seconds);
  }
}

// ---- stalled ranks ----------------------------------------------------------------------

TEST_F(Faults, StalledRankEndsTheJob) {
  struct Case {
    const char* spec;
    const char* named;  // what the message must name
  };
  const Case cases[] = {{"rank_file@8:1:stall", "rank 1 did not finish writing its checkpoint file"},
                        {"start@8:1:stall", "rank 1 did not finish starting the save"},
                        {"before_commit@8:0:stall", "no answer from rank 0"},
                        {"startup:1:stall", "did not complete within"}};
  const double timeout = 4;
  for (const Case& c : cases) {
    const std::string out = path(std::string("stall-") + c.spec);
    Opts o;
    o.env = std::string("EASYCTX_FAULT=") + c.spec;
    o.args = "--set parallel.collective_timeout_s=" + std::to_string(static_cast<int>(timeout));
    o.timeout_s = 90;
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << c.spec << "\n" << r.out;
    EXPECT_NE(r.rc, 124) << c.spec << ": hung until the outer timeout\n" << r.out;
    EXPECT_TRUE(has(r.out, c.named)) << c.spec << "\n" << r.out;
    EXPECT_GT(r.after_fault, 0) << c.spec;
    // The timeout, the grace of the ranks that wait for rank 0 (max(1 s, 10%)), and MPI_Abort.
    EXPECT_LT(r.after_fault, timeout + 1 + 10) << c.spec;
    if (has(std::string(c.spec), "@8")) { EXPECT_EQ(run_steps(out), std::vector<int64_t>{4}) << c.spec; }
    finish_and_compare(out, std::string("stall at ") + c.spec);
    summary("stalled rank", c.spec, HasFailure() ? "FAILED" : "clean error, then nothing lost", r.after_fault);
  }
}

// ---- full disks -------------------------------------------------------------------------

TEST_F(Faults, FullDisk) {
  // (a) A file-size limit on rank 1 (its writes fail with EFBIG) during the save of step 8.
  {
    const std::string out = path("efbig-ckpt");
    Opts stop;
    stop.env = "EASYCTX_FAULT=recorded@6:0:kill";
    ASSERT_NE(train(out, stop).rc, 0);
    Opts o;
    o.wrap = "[ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && ulimit -f 64";
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(has(r.out, "checkpoint step 8 not written")) << r.out;
    EXPECT_TRUE(has(r.out, "rank 1:")) << r.out;
    EXPECT_TRUE(has(r.out, "File too large")) << r.out;
    EXPECT_EQ(run_steps(out), std::vector<int64_t>{4});
    EXPECT_FALSE(fs::exists(out + "/checkpoints/step-00000008.tmp")) << "the failed save's files are removed";
    finish_and_compare(out, "EFBIG during a save");
    summary("full disk", "file-size limit on rank 1 during a save (EFBIG)",
            HasFailure() ? "FAILED" : "clean error, previous checkpoint intact, then nothing lost", r.seconds);
  }
  // (b) A file-size limit on rank 0 that metrics.jsonl crosses: an error naming the file, never
  // a silent gap; only whole lines remain. (plan.json crosses it first: only a warning.)
  {
    const std::string out = path("efbig-metrics");
    Opts o;
    o.wrap = "[ \"$OMPI_COMM_WORLD_RANK\" = 0 ] && ulimit -f 2";
    o.args = "--set output.save_every=0 --set logging.tensorboard=false";  // (its file is case (b2)'s)
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(has(r.out, "metrics.jsonl: cannot write the metrics record of step")) << r.out;
    // (plan.json, written first, crossed the limit already: a warning, and the run went on)
    EXPECT_TRUE(has(r.out, "/plan.json: not written (File too large")) << r.out;
    EXPECT_FALSE(fs::exists(out + "/plan.json.tmp"));
    EXPECT_TRUE(has(r.out, "File too large")) << r.out;
    const std::string m = slurp(out + "/metrics.jsonl");
    EXPECT_TRUE(m.empty() || m.back() == '\n') << "a partial line was left";
    EXPECT_NO_THROW(metrics_of(out));
    finish_and_compare(out, "EFBIG on metrics.jsonl");
    summary("full disk", "file-size limit on metrics.jsonl (EFBIG)",
            HasFailure() ? "FAILED" : "clean error, then nothing lost", r.seconds);
  }
  // (b2) The same limit crossed by the TensorBoard event file: an error naming it; the file
  // holds whole records only, every one of them readable.
  {
    const std::string out = path("efbig-tensorboard");
    Opts o;
    o.wrap = "[ \"$OMPI_COMM_WORLD_RANK\" = 0 ] && ulimit -f 2";
    o.args = "--set output.save_every=0 --set logging.metrics=false";
    const Result r = train(out, o);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(has(r.out, "cannot write the TensorBoard scalars record: File too large")) << r.out;
    const std::vector<std::string> files = tb::list_event_files(out + "/tensorboard");
    ASSERT_EQ(files.size(), 1u) << r.out;
    EXPECT_TRUE(has(r.out, files[0])) << "the message names the file: " << r.out;
    const tb::EventFile f = tb::read_event_file(files[0]);
    EXPECT_EQ(f.partial_tail_bytes, 0u) << "a partial record was left";
    ASSERT_GE(f.events.size(), 2u);
    EXPECT_EQ(f.events.back().step, static_cast<int64_t>(f.events.size()) - 1) << "steps 1.. in order, none lost";
    EXPECT_LE(fs::file_size(files[0]), 2048u);
    summary("full disk", "file-size limit on the TensorBoard event file (EFBIG)",
            HasFailure() ? "FAILED" : "clean error naming the file, whole records only", r.seconds);
  }
  // (c) A real full file system: a 2.6 MB tmpfs (one checkpoint is ~1.5 MB) in a private mount
  // namespace (as root, as CI runs; else in a user namespace too); the second save fails with
  // ENOSPC. Neither allowed is a failure: the case would pass without checking anything.
  {
    const std::string mnt = path("tmpfs"), keep = path("enospc");
    fs::create_directories(mnt);
    std::string unshare = "unshare -m";
    if (run_cmd(unshare + " true").rc != 0) unshare = "unshare -rm";
    if (run_cmd(unshare + " sh -c 'mount -t tmpfs -o size=64k tmpfs " + mnt + " && umount " + mnt + "'").rc != 0) {
      ADD_FAILURE() << "a private tmpfs needs root or unprivileged user namespaces (unshare -m / -rm)";
    } else {
      Opts o;
      const std::string inner = mpirun(o) + bin_dir() + "/easyctx_train " + stage_ + " --set output.dir=" + mnt +
                                "/run > " + path("enospc.log") + " 2>&1; echo $? > " + path("enospc.rc") + "; cp -a " +
                                mnt + "/run " + keep;
      const auto t0 = Clock::now();
      run_cmd(unshare + " sh -c 'mount -t tmpfs -o size=2600k tmpfs " + mnt + " && " + inner + "'");
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const std::string log = slurp(path("enospc.log"));
      EXPECT_NE(trim(slurp(path("enospc.rc"))), "0") << log;
      EXPECT_TRUE(has(log, "No space left on device")) << log;
      EXPECT_TRUE(has(log, "not written")) << log;
      ASSERT_TRUE(fs::exists(keep + "/run.json")) << log;
      const std::vector<int64_t> steps = run_steps(keep);
      ASSERT_FALSE(steps.empty()) << log;
      EXPECT_EQ(ckpt::resolve_verified(keep, nullptr).step, steps.front());
      for (const auto& e : fs::directory_iterator(keep + "/checkpoints"))
        EXPECT_FALSE(ends_with(e.path().string(), ".tmp")) << e.path();
      finish_and_compare(keep, "ENOSPC during a save");
      summary("full disk", "tmpfs full during a save (ENOSPC)",
              HasFailure() ? "FAILED" : "clean error, previous checkpoint intact, then nothing lost", secs);
    }
  }
}

// ---- corrupt checkpoints ----------------------------------------------------------------

TEST_F(Faults, CorruptCheckpoints) {
  const std::string base = path("corrupt-base");
  {
    Opts o;
    o.env = "EASYCTX_FAULT=recorded@10:0:kill";
    ASSERT_NE(train(base, o).rc, 0);
    ASSERT_EQ(run_steps(base), (std::vector<int64_t>{8, 4}));
  }
  const std::string s8 = "/checkpoints/step-00000008", s4 = "/checkpoints/step-00000004";
  {  // a flipped bit in the newest: --resume auto falls back to step 4, names the file
    const std::string out = path("flip-newest");
    fs::copy(base, out, fs::copy_options::recursive);
    flip_bit(out + s8 + "/rank-00001.h5", 2);
    const Result r = train(out);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(has(r.out, "rank-00001.h5: slice_2")) << r.out;
    EXPECT_TRUE(has(r.out, "fails its checksum")) << r.out;
    EXPECT_TRUE(has(r.out, "resuming from " + out + s4)) << r.out;
    finish_and_compare(out, "bit flip in the newest checkpoint");
    summary("corrupt checkpoint", "bit flip in the newest (--resume auto)",
            HasFailure() ? "FAILED" : "falls back with a warning, nothing lost", r.seconds);
  }
  {  // a flipped bit in index.json: its checksum in COMMITTED names it
    const std::string out = path("flip-index");
    fs::copy(base, out, fs::copy_options::recursive);
    std::string idx = slurp(out + s8 + "/index.json");
    const size_t at = idx.find("\"next_step\": 8");
    ASSERT_NE(at, std::string::npos) << idx;
    idx[at + 13] = '9';
    write_file_atomic(out + s8 + "/index.json", idx);
    const Result r = train(out);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(has(r.out, "index.json fails its checksum")) << r.out;
    finish_and_compare(out, "bit flip in index.json");
    summary("corrupt checkpoint", "changed index.json (--resume auto)",
            HasFailure() ? "FAILED" : "falls back with a warning, nothing lost", r.seconds);
  }
  {  // every checkpoint of the run broken: a clean error naming both; nothing changed
    const std::string out = path("flip-all");
    fs::copy(base, out, fs::copy_options::recursive);
    flip_bit(out + s8 + "/rank-00000.h5", 0);
    fs::resize_file(out + s4 + "/rank-00001.h5", fs::file_size(out + s4 + "/rank-00001.h5") / 2);
    const std::string metrics = slurp(out + "/metrics.jsonl"), runjson = slurp(out + "/run.json");
    const Result r = train(out);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, "no checkpoint there passes verification")) << r.out;
    EXPECT_TRUE(has(r.out, "step-00000008/rank-00000.h5: slice_0")) << r.out;
    EXPECT_TRUE(has(r.out, "rank-00001.h5 has")) << r.out;
    EXPECT_FALSE(has(r.out, "step 1/")) << "it must not train from model.init";
    EXPECT_EQ(slurp(out + "/metrics.jsonl"), metrics) << "metrics.jsonl was changed";
    EXPECT_EQ(slurp(out + "/run.json"), runjson);
    summary("corrupt checkpoint", "every checkpoint of the run broken (--resume auto)",
            HasFailure() ? "FAILED" : "clean error naming each, nothing changed", r.seconds);
    // --resume none is the explicit way to start over.
    Opts o;
    o.args = "--resume none";
    EXPECT_EQ(train(out, o).rc, 0);
    EXPECT_EQ(metrics_of(out), metrics_of(straight_));
    EXPECT_EQ(slurp(out + "/final/model.safetensors"), slurp(straight_ + "/final/model.safetensors"));
  }
  // A flipped bit in an Adam moment (rank 0's slice_1: adam_m of the first unit) and one in a
  // weight (slice_0: its master weights), each in a copy of step 8.
  const std::string flipped = path("flip-step"), flipped_w = path("flip-weight");
  fs::copy(base, flipped, fs::copy_options::recursive);
  fs::copy(base, flipped_w, fs::copy_options::recursive);
  ASSERT_FALSE(ckpt::is_weight_array(array_of(flipped + s8, 0, 1))) << array_of(flipped + s8, 0, 1);
  ASSERT_TRUE(ckpt::is_weight_array(array_of(flipped_w + s8, 0, 0))) << array_of(flipped_w + s8, 0, 0);
  flip_bit(flipped + s8 + "/rank-00000.h5", 1);
  flip_bit(flipped_w + s8 + "/rank-00000.h5", 0);
  {  // --resume <step folder>: verified like the auto path (all of it: the moments are loaded)
    const Result r = train(path("resume-flipped"), opts("", "--resume " + flipped + s8));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, "step-00000008/rank-00000.h5: slice_1")) << r.out;
    EXPECT_FALSE(fs::exists(path("resume-flipped") + "/run.json")) << "a refused start records nothing";
    summary("corrupt checkpoint", "--resume STEP_FOLDER with a flipped bit",
            HasFailure() ? "FAILED" : "clean error naming file and dataset", r.seconds);
  }
  {  // model.init: ckpt:<step folder> with model.carry_optimizer: the moments are loaded, and verified
    const Result r = train(path("carry-flipped"),
                           opts("", "--set model.init=ckpt:" + flipped + s8 + " --set model.carry_optimizer=true"));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, "step-00000008/rank-00000.h5: slice_1")) << r.out;
    summary("corrupt checkpoint", "model.init: ckpt:STEP_FOLDER, carry_optimizer, a flipped bit in a moment",
            HasFailure() ? "FAILED" : "clean error naming file and dataset", r.seconds);
  }
  {  // model.init: ckpt:<step folder> (the weights only)
    const Result r = train(path("init-flipped"), opts("", "--set model.init=ckpt:" + flipped_w + s8));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, "step-00000008/rank-00000.h5: slice_0")) << r.out;
    summary("corrupt checkpoint", "model.init: ckpt:STEP_FOLDER with a flipped bit in a weight",
            HasFailure() ? "FAILED" : "clean error naming file and dataset", r.seconds);
  }
  {  // easyctx_convert --from ckpt:<step folder>: a weight is refused
    const Result r =
        run_cmd(bin_dir() + "/easyctx_convert --from ckpt:" + flipped_w + s8 + " --to hf:" + path("hf-flipped"));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, "slice_0")) << r.out;
    EXPECT_FALSE(fs::exists(path("hf-flipped"))) << "nothing exported";
    EXPECT_FALSE(has(r.out, "converted")) << r.out;
    summary("corrupt checkpoint", "easyctx_convert --from ckpt:STEP_FOLDER with a flipped bit in a weight",
            HasFailure() ? "FAILED" : "clean error naming file and dataset", r.seconds);
  }
  {  // ... a moment is not: the conversion reads and checks the weights only, which are intact
    const Result r =
        run_cmd(bin_dir() + "/easyctx_convert --from ckpt:" + flipped + s8 + " --to hf:" + path("hf-moment"));
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(fs::exists(path("hf-moment") + "/config.json")) << r.out;
    summary("corrupt checkpoint", "easyctx_convert --from ckpt:STEP_FOLDER with a flipped bit in a moment",
            HasFailure() ? "FAILED" : "converted (the moments are neither read nor checked)", r.seconds);
  }
}

// ---- foreign checkpoints and runs -------------------------------------------------------

TEST_F(Faults, ForeignRunsAndModels) {
  // An older run (another seed: other weights) finished in the folder; a new run beside it
  // (--resume none) is killed after its first save; a requeue (--resume auto) continues the
  // new run, never the old one, and writes final/ with the new run's weights.
  const std::string out = path("two-runs");
  {
    Opts old;
    old.args = "--set train.seed=7";
    ASSERT_EQ(train(out, old).rc, 0);
  }
  const auto old = ckpt::read_run_info(out);
  ASSERT_TRUE(old);
  const std::string old_final = slurp(out + "/final/model.safetensors");
  Opts none;
  none.args = "--resume none";
  none.env = "EASYCTX_FAULT=recorded@6:0:kill";
  const Result r = train(out, none);
  EXPECT_NE(r.rc, 0) << r.out;
  // The new run's fresh checkpoint of step 4 is there (the old run's 8 and 12 did not
  // out-rank it), and the old run's checkpoints are all still in place.
  EXPECT_EQ(run_steps(out), std::vector<int64_t>{4});
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step-00000008/COMMITTED"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step-00000012/COMMITTED"));
  EXPECT_FALSE(fs::exists(out + "/DONE")) << "the old run's DONE would stop a requeue";
  finish_and_compare(out, "--resume none beside a finished run, killed, then --resume auto");
  EXPECT_NE(slurp(out + "/final/model.safetensors"), old_final);
  EXPECT_EQ(slurp(out + "/previous/" + old->run_id + "/final/model.safetensors"), old_final);
  // The old run's checkpoints were set aside when the new run saved the same steps.
  EXPECT_TRUE(fs::exists(out + "/previous/" + old->run_id + "/checkpoints/step-00000012/COMMITTED"));
  summary("foreign run in the folder", "--resume none beside a finished run, kill -9, --resume auto",
          HasFailure() ? "FAILED" : "continues the new run, nothing lost", r.seconds);

  {  // another run's checkpoint (a higher step) dropped into this run's checkpoints/
    const std::string mine = path("dropped");
    Opts k;
    k.env = "EASYCTX_FAULT=recorded@6:0:kill";
    ASSERT_NE(train(mine, k).rc, 0);
    fs::copy(out + "/previous/" + old->run_id + "/checkpoints/step-00000012", mine + "/checkpoints/step-00000012",
             fs::copy_options::recursive);
    const Result d = train(mine);
    EXPECT_EQ(d.rc, 0) << d.out;
    EXPECT_TRUE(has(d.out, "resuming from " + mine + "/checkpoints/step-00000004")) << d.out;
    EXPECT_TRUE(has(d.out, "left alone")) << d.out;
    finish_and_compare(mine, "another run's checkpoint in checkpoints/");
    summary("foreign run in the folder", "another run's newer checkpoint in checkpoints/ (--resume auto)",
            HasFailure() ? "FAILED" : "ignored (named), nothing lost", d.seconds);
  }
  {  // a rollback: --resume <this run's older step> starts a new run from there
    const std::string rb = path("rollback");
    Opts k;
    k.env = "EASYCTX_FAULT=recorded@10:0:kill";
    ASSERT_NE(train(rb, k).rc, 0);
    const auto first = ckpt::read_run_info(rb);
    const Result b =
        train(rb, opts("EASYCTX_FAULT=recorded@6:0:kill", "--resume " + rb + "/checkpoints/step-00000004"));
    EXPECT_NE(b.rc, 0) << b.out;
    const auto second = ckpt::read_run_info(rb);
    ASSERT_TRUE(first && second);
    EXPECT_NE(first->run_id, second->run_id) << "a rollback is a new run";
    EXPECT_TRUE(fs::exists(rb + "/checkpoints/step-00000008/COMMITTED")) << "the first run's step 8 is kept";
    // The new run has no checkpoint yet: --resume auto continues it from where it started.
    const Result c = train(rb);
    EXPECT_EQ(c.rc, 0) << c.out;
    EXPECT_TRUE(has(c.out, "resuming from " + rb + "/checkpoints/step-00000004")) << c.out;
    finish_and_compare(rb, "rollback with --resume STEP_FOLDER");
    summary("foreign run in the folder", "rollback: --resume an older step of the run",
            HasFailure() ? "FAILED" : "new run from there, old steps kept, nothing lost", b.seconds);
  }
  {  // another model's checkpoint: refused, nothing recorded
    const std::string other_model = path("tiny3");
    write_tiny_model(path(""), 3);
    Opts o3;
    o3.args = "--set model.config=" + path("tiny3.yaml") + " --set train.steps=4";
    ASSERT_EQ(train(other_model, o3).rc, 0);
    const Result m = train(path("wrong-model"), opts("", "--resume " + other_model));
    EXPECT_EQ(m.rc, 2) << m.out;
    EXPECT_TRUE(has(m.out, "holds a different model (num_hidden_layers 3")) << m.out;
    EXPECT_FALSE(fs::exists(path("wrong-model") + "/run.json"));
    const Result i = train(path("wrong-init"), opts("", "--set model.init=ckpt:" + other_model));
    EXPECT_EQ(i.rc, 2) << i.out;
    EXPECT_TRUE(has(i.out, "holds a different model (num_hidden_layers 3")) << i.out;
    summary("foreign checkpoint", "another model's checkpoint (--resume PATH, model.init ckpt:)",
            HasFailure() ? "FAILED" : "clean error", m.seconds + i.seconds);
  }
  {  // easyctx_convert --to ckpt:<run folder>: refused, nothing of the run deleted
    const std::vector<int64_t> before = run_steps(out);
    const Result c = run_cmd(bin_dir() + "/easyctx_convert --from hf:" + out + "/final --to ckpt:" + out);
    EXPECT_EQ(c.rc, 2) << c.out;
    EXPECT_TRUE(has(c.out, "holds a training run")) << c.out;
    EXPECT_EQ(run_steps(out), before);
    // Into an empty folder it works, and a second conversion into it is refused too.
    const std::string conv = path("converted");
    EXPECT_EQ(run_cmd(bin_dir() + "/easyctx_convert --from hf:" + out + "/final --to ckpt:" + conv).rc, 0);
    EXPECT_TRUE(fs::exists(conv + "/checkpoints/step-00000000/COMMITTED"));
    const Result again = run_cmd(bin_dir() + "/easyctx_convert --from hf:" + out + "/final --to ckpt:" + conv);
    EXPECT_EQ(again.rc, 2) << again.out;
    EXPECT_TRUE(fs::exists(conv + "/checkpoints/step-00000000/COMMITTED"));
    summary("foreign checkpoint", "easyctx_convert --to ckpt: a run folder",
            HasFailure() ? "FAILED" : "refused, nothing deleted", c.seconds);
  }
}

// ---- non-finite loss ----------------------------------------------------------------------

// A checkpoint like `from`'s newest, with one NaN weight (valid checksums: a real divergence,
// not a corrupt file).
void write_nan_checkpoint(const std::string& from, const std::string& to) {
  const ckpt::CheckpointRef ref = ckpt::resolve_verified(from, nullptr);
  const ckpt::CheckpointReader r(ref.path);
  const Json index = parse_json(read_file(ref.path + "/index.json"), "index");
  std::map<std::string, int64_t> arrays;
  for (const Json& f : index.at("files").as_array())
    for (const Json& s : f.at("slices").as_array()) arrays[s[0].as_string()] = s[1].as_int();
  std::vector<std::vector<float>> data;
  ckpt::WriterOptions wo;
  wo.run_id = "nan-fixture";
  ckpt::CheckpointWriter w(MPI_COMM_SELF, to + "/checkpoints", 0, wo);
  for (const auto& [name, n] : arrays) {
    data.emplace_back(static_cast<size_t>(n));
    r.read(name, 0, n, data.back().data());
    if (name == "master/layer.0") data.back()[5] = std::nanf("");
    w.add(name, n, 0, data.back().data(), n);
  }
  Json meta = r.meta();
  meta.set("next_step", 0);
  w.commit(meta, 1);
}

TEST_F(Faults, NonFiniteLoss) {
  const std::string nan = path("nan-ckpt");
  write_nan_checkpoint(straight_, nan);
  const std::string out = path("nan-run");
  const Result r = train(out, opts("", "--set model.init=ckpt:" + nan));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r.out, "step 1: loss ")) << r.out;
  EXPECT_TRUE(has(r.out, "not finite")) << r.out;
  EXPECT_TRUE(has(r.out, "stopping before the update")) << r.out;
  EXPECT_TRUE(run_steps(out).empty()) << "nothing with those weights is committed";
  EXPECT_FALSE(fs::exists(out + "/final"));
  summary("non-finite loss", "NaN weight: train.on_nonfinite stop",
          HasFailure() ? "FAILED" : "clean error naming the step", r.seconds);
}

// In process: a NaN gradient for one step. stop: the error names the step and no weight moved;
// skip_step: the step changes nothing, the next one trains.
TEST(NonFinite, StopOrSkipOneStep) {
  TempDir dir("nonfinite");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  dist::MpiComm world(MPI_COMM_SELF, "world", 60), dp(MPI_COMM_SELF, "dp", 60);
  for (NonFinitePolicy policy : {NonFinitePolicy::Stop, NonFinitePolicy::SkipStep}) {
    StageConfig c = tiny_stage(dir / "shard.h5", dir / (std::string("run-") + to_string(policy)));
    c.train.steps = 6;
    c.train.on_nonfinite = policy;
    train::Trainer t(c, world, dp);
    t.train_step(0);
    t.train_step(1);
    float* w = t.master()[1].ptr<float>();  // layer 0
    const float keep = w[3];
    auto snapshot = [&] {
      std::vector<float> all;
      for (const ops::Tensor& u : t.master()) all.insert(all.end(), u.ptr<float>(), u.ptr<float>() + u.numel());
      return all;
    };
    w[3] = std::nanf("");
    const std::vector<float> before = snapshot();
    if (policy == NonFinitePolicy::Stop) {
      try {
        t.train_step(2);
        ADD_FAILURE() << "a NaN loss was trained on";
      } catch (const Error& e) {
        EXPECT_TRUE(has(e.what(), "step 3: loss ")) << e.what();
        EXPECT_TRUE(has(e.what(), "not finite")) << e.what();
      }
    } else {
      EXPECT_TRUE(t.train_step(2).skipped);
    }
    const std::vector<float> after = snapshot();
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "weights moved";
    w[3] = keep;
    const train::StepStats st = t.train_step(3);
    EXPECT_FALSE(st.skipped);
    EXPECT_TRUE(std::isfinite(st.loss));
  }
}

}  // namespace
}  // namespace easyctx::test
