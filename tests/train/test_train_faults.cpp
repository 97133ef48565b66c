// easyctx_train's faults as a user meets them (issue 53), end to end on the CPU with the tiny
// model: a file-size limit with SIGXFSZ at its default (the program runs under a shell's
// `ulimit -f N`, as a batch system sets it; the test never touches the signal), a full disk
// (a tmpfs in a private mount namespace), resumes with a changed training setting, bad data
// checked before anything of the run folder changes, a stop signal in the first moments of a
// run, and the messages a user must be able to act on. The class checked for the writers
// (run.json, plan.json, metrics.jsonl, TensorBoard events, checkpoints, the Hugging Face
// export): a non-zero exit (never a signal) with a message naming the file and the errno's
// text; every file left is whole (metrics lines, event records, committed checkpoints that
// verify; no temporary file); and `--resume auto` afterwards ends with the uninterrupted run's
// weights and metrics.jsonl, bit for bit.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include "ckpt/run_folder.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/json.h"
#include "core/strings.h"
#include "core/tensorboard.h"
#include "data/shard.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace easyctx::test {
namespace {

struct Outcome {
  int rc = -1;  // the exit code, or 128 + the signal that ended the process
  std::string out;
};

// `cmd` through bash, stdout and stderr merged.
Outcome sh(const std::string& cmd) {
  Outcome r;
  FILE* p = popen(("bash -c '" + cmd + "' 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  return r;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// The failed assertions of the running test so far (a case's summary line is its own).
int failures() {
  const ::testing::TestResult* r = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  int n = 0;
  for (int i = 0; i < r->total_part_count(); ++i) n += r->GetTestPartResult(i).failed();
  return n;
}

std::string slurp(const std::string& path) { return fs::exists(path) ? read_file(path) : std::string(); }

// metrics.jsonl without the wall-clock fields; every line must be a whole record.
std::vector<std::string> metrics_of(const std::string& run) {
  std::vector<std::string> out;
  const std::string text = slurp(run + "/metrics.jsonl");
  EXPECT_TRUE(text.empty() || text.back() == '\n') << run << ": a partial metrics line";
  for (const std::string& line : split(text, '\n')) {
    if (line.empty()) continue;
    const Json j = parse_json(line, run + "/metrics.jsonl");
    out.push_back(without_wall_clock(j));
  }
  return out;
}

// Every file a failed run left is whole: no temporary file, metrics lines and event records
// whole, run.json readable, every committed checkpoint verifying.
void expect_whole(const std::string& run, const std::string& what) {
  if (!fs::exists(run)) return;
  for (const auto& e : fs::recursive_directory_iterator(run))
    EXPECT_FALSE(has(e.path().filename().string(), ".tmp")) << what << ": left " << e.path();
  EXPECT_NO_THROW(metrics_of(run)) << what;
  if (fs::exists(run + "/tensorboard")) {
    for (const std::string& f : tb::list_event_files(run + "/tensorboard"))
      EXPECT_EQ(tb::read_event_file(f).partial_tail_bytes, 0u) << what << ": a partial event record in " << f;
  }
  if (fs::exists(run + "/run.json")) { EXPECT_NO_THROW(parse_json(read_file(run + "/run.json"), run)) << what; }
  if (fs::exists(run + "/checkpoints")) {
    for (const ckpt::CheckpointEntry& e : ckpt::list_checkpoints(run + "/checkpoints"))
      EXPECT_NO_THROW(ckpt::CheckpointReader r(e.path)) << what << ": " << e.path;
    EXPECT_NO_THROW(ckpt::resolve_verified(run, nullptr)) << what;
  }
}

class TrainFaults : public ::testing::Test {
 protected:
  static constexpr int kSteps = 8;

  void SetUp() override {
    dir_ = std::make_unique<TempDir>("train-faults");
    rng_.seed(test_seed());
    write_walk_shard(*dir_ / "shard.h5", rng_(), 40, 20, 90, 256);
    stage_ = write_stage("stage.yaml", "");
  }

  std::string write_stage(const std::string& name, const std::string& extra) const {
    const std::string path = *dir_ / name;
    write_file_atomic(path, "model: {config: tiny}\ndata: {path: " + *dir_ / "shard.h5" +
                                ", seq_length: 32}\ntrain: {device: cpu, steps: " + std::to_string(kSteps) +
                                ", batch_size: 2, lr: 3.0e-3, schedule: cosine, warmup_steps: 2}\n"
                                "activation: {checkpoint: layer}\noutput: {save_every: 4, hf_dtype: f32}\n"
                                "logging: {every: 1}\n" +
                                extra);
    return path;
  }

  // easyctx_train on `stage` into `out` (one process), after the shell snippet `pre`.
  Outcome train(const std::string& out, const std::string& args = "", const std::string& pre = "",
                const std::string& stage = "") const {
    return sh((pre.empty() ? "" : pre + "; ") + "OMP_NUM_THREADS=1 exec " + bin_dir() + "/easyctx_train " +
              (stage.empty() ? stage_ : stage) + " --set output.dir=" + out + " " + args);
  }

  // The uninterrupted run (made once per test).
  const std::string& straight() {
    if (straight_.empty()) {
      straight_ = *dir_ / "straight";
      const Outcome r = train(straight_);
      EXPECT_EQ(r.rc, 0) << r.out;
    }
    return straight_;
  }

  // --resume auto until DONE, then the uninterrupted run's weights and metrics, bit for bit.
  void finish_and_compare(const std::string& out, const std::string& what) {
    for (int i = 0; i < 3 && !fs::exists(out + "/DONE"); ++i) {
      const Outcome r = train(out);
      ASSERT_EQ(r.rc, 0) << what << ": the resumed run failed:\n" << r.out;
    }
    ASSERT_TRUE(fs::exists(out + "/DONE")) << what;
    EXPECT_EQ(slurp(out + "/final/model.safetensors"), slurp(straight() + "/final/model.safetensors"))
        << what << ": the final weights differ from the uninterrupted run's";
    EXPECT_EQ(metrics_of(out), metrics_of(straight())) << what;
  }

  std::unique_ptr<TempDir> dir_;
  std::mt19937_64 rng_;
  std::string stage_, straight_;
};

// One writer at a time crosses the limit (the others off, or under it): each ends the run with
// an error naming its file and "File too large", never SIGXFSZ (rc 153).
TEST_F(TrainFaults, FileSizeLimitOnEveryWriter) {
  struct Case {
    const char* writer;
    int kib;           // ulimit -f (1024-byte blocks in bash)
    const char* args;  // what keeps the other writers under the limit
    const char* named;
    bool resumes;  // --resume auto finishes it afterwards
  };
  const Case cases[] = {
      {"run.json", 0, "", "/run.json", false},
      {"metrics.jsonl", 1, "--set logging.tensorboard=false --set output.save_every=0",
       "/metrics.jsonl: cannot write the metrics record", true},
      {"TensorBoard events", 1, "--set logging.metrics=false --set output.save_every=0",
       "/tensorboard/events.out.tfevents.", false},
      {"checkpoint", 64, "", "checkpoint step 4 not written", true},
      {"Hugging Face export", 64, "--set output.save_every=0 --set output.save_final=false",
       "/final/model.safetensors: not written", false},
  };
  for (const Case& c : cases) {
    const int failures_before = failures();
    std::string slug = c.writer;
    std::replace(slug.begin(), slug.end(), ' ', '-');
    const std::string out = *dir_ / ("limit-" + std::to_string(c.kib) + "-" + slug);
    const Outcome r = train(out, c.args, "ulimit -f " + std::to_string(c.kib));
    EXPECT_TRUE(r.rc == 1 || r.rc == 2) << c.writer << ": rc " << r.rc << " (153 is SIGXFSZ)\n" << r.out;
    EXPECT_TRUE(has(r.out, c.named)) << c.writer << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "File too large")) << c.writer << "\n" << r.out;
    expect_whole(out, c.writer);
    if (c.resumes) finish_and_compare(out, std::string("after the file-size limit on ") + c.writer);
    std::printf("FAULT-SUMMARY | file-size limit | %s (ulimit -f %d) | %s\n", c.writer, c.kib,
                failures() > failures_before ? "FAILED" : "clean error naming the file, whole files");
  }
}

// A full file system (a tmpfs of a few sizes in a private mount namespace, so that a different
// writer meets ENOSPC first: the TensorBoard file, metrics.jsonl, a checkpoint's creation, its
// data, the second checkpoint, the Hugging Face export): a clean error naming the file and "No space left on
// device", whole files, and the run finishes from there once there is room.
TEST_F(TrainFaults, FullDiskAtEverySize) {
  const std::string mnt = *dir_ / "mnt";
  fs::create_directories(mnt);
  std::string unshare = "unshare -m";
  if (sh(unshare + " true").rc != 0) unshare = "unshare -rm";
  ASSERT_EQ(sh(unshare + " sh -c \"mount -t tmpfs -o size=64k tmpfs " + mnt + "\"").rc, 0)
      << "a private tmpfs needs root or unprivileged user namespaces (CI runs as root)";
  int failed = 0;
  std::string named;  // the errors, one line each
  for (const char* size : {"4k", "8k", "12k", "200k", "1800k", "3200k"}) {
    const int failures_before = failures();
    const std::string keep = *dir_ / (std::string("enospc-") + size);
    const Outcome r = sh(unshare + " sh -c \"mount -t tmpfs -o size=" + size + " tmpfs " + mnt +
                         " && OMP_NUM_THREADS=1 " + bin_dir() + "/easyctx_train " + stage_ +
                         " --set output.dir=" + mnt + "/run; echo rc=\\$?; cp -a " + mnt + "/run " + keep + "\"");
    const bool ok = has(r.out, "rc=0\n");
    if (!ok) {
      ++failed;
      EXPECT_TRUE(has(r.out, "No space left on device")) << size << "\n" << r.out;
      EXPECT_TRUE(has(r.out, mnt + "/run/") || has(r.out, "checkpoint step")) << size << ": names no file\n" << r.out;
      EXPECT_FALSE(has(r.out, "rc=1") && has(r.out, "Segmentation")) << r.out;
      expect_whole(keep, std::string("tmpfs ") + size);
      finish_and_compare(keep, std::string("after ENOSPC on a tmpfs of ") + size);
    }
    const size_t e = r.out.find("error: ");
    const std::string said = e == std::string::npos ? "" : r.out.substr(e, r.out.find('\n', e) - e);
    named += said + "\n";
    std::printf(
        "FAULT-SUMMARY | full disk | tmpfs of %s: %s | %s\n", size, said.c_str(),
        !ok ? (failures() > failures_before ? "FAILED" : "clean error, whole files, then nothing lost") : "fits");
  }
  EXPECT_EQ(failed, 6) << "a size no longer makes a writer fail";
  for (const char* writer : {"/tensorboard/events.out.tfevents.", "/metrics.jsonl: ", "/checkpoints/step-0000000",
                             "/final/model.safetensors: "})
    EXPECT_TRUE(has(named, writer)) << "no size made " << writer << " meet the full disk first:\n" << named;
}

// A resume with a changed training setting names it (the list comes from the config registry,
// so every key that changes what is trained is named); the cursor refuses what it cannot
// continue, after the warning.
TEST_F(TrainFaults, ResumeNamesEveryChangedTrainingSetting) {
  const std::string base = *dir_ / "base";
  ASSERT_NE(train(base, "", "export EASYCTX_FAULT=recorded@6:0:kill").rc, 0);
  struct Change {
    const char* set;
    const char* named;
  };
  const Change changes[] = {
      {"data.document_mask=true", "data.document_mask false -> true"},
      {"data.packing=best_fit", "data.packing window -> best_fit"},
      {"data.long_documents=refuse", "data.long_documents split -> refuse"},
      {"train.lr=1.0e-3", "train.lr 0.003 -> 0.001"},
      {"train.on_nonfinite=skip_step", "train.on_nonfinite stop -> skip_step"},
      {"train.batch_size=1 --set train.grad_accum=2", ""},  // the same global batch: not a change
      {"train.batch_size=4", "global batch (batch_size x grad_accum x data-parallel) 2 -> 4"},
  };
  for (const Change& c : changes) {
    const std::string out = *dir_ / ("resume-" + std::to_string(&c - changes));
    fs::copy(base, out, fs::copy_options::recursive);
    const Outcome r = train(out, std::string("--set ") + c.set);
    if (*c.named) {
      EXPECT_TRUE(has(r.out, "with changed training settings (")) << c.set << "\n" << r.out;
      EXPECT_TRUE(has(r.out, c.named)) << c.set << "\n" << r.out;
    } else {
      EXPECT_EQ(r.rc, 0) << r.out;
      EXPECT_FALSE(has(r.out, "changed training settings")) << c.set << "\n" << r.out;
    }
  }
}

// Bad data is found before the run folder changes: `--resume none` beside a finished run with
// a missing data path, an all-zero-weights shard, or a loss weight of 7 exits 2 naming the file,
// and the finished run is still there as it was (nothing archived to previous/).
TEST_F(TrainFaults, BadDataRefusedBeforeTheFolderChanges) {
  const std::string out = *dir_ / "finished";
  ASSERT_EQ(train(out).rc, 0);
  const std::string run_json = slurp(out + "/run.json"), metrics = slurp(out + "/metrics.jsonl");
  data::ShardMeta m;
  m.tokenizer_sha256 = std::string(64, '0');
  m.vocab_size = 256;
  m.has_loss_weights = true;
  {
    data::TokenShardWriter w(*dir_ / "zero.h5", m, 4096);
    std::vector<uint32_t> ids(300);
    for (auto& x : ids) x = static_cast<uint32_t>(rng_() % 256);
    const std::vector<uint8_t> zeros(ids.size(), 0);
    w.add_document(ids.data(), ids.size(), w.source_index("x"), zeros.data());
    w.commit();
  }
  fs::copy_file(*dir_ / "zero.h5", *dir_ / "seven.h5");
  const uint64_t at = rng_() % 300;
  {
    hid_t f = H5Fopen((*dir_ / "seven.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "loss_weights", H5P_DEFAULT);
    hid_t fsp = H5Dget_space(ds);
    hsize_t start[1] = {at}, one[1] = {1};
    H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, nullptr, one, nullptr);
    hid_t ms = H5Screate_simple(1, one, nullptr);
    const uint8_t seven = 7;
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT8, ms, fsp, H5P_DEFAULT, &seven), 0);
    H5Sclose(ms);
    H5Sclose(fsp);
    H5Dclose(ds);
    H5Fclose(f);
  }
  const std::pair<std::string, std::string> bad[] = {
      {*dir_ / "missing", *dir_ / "missing does not exist"},
      {*dir_ / "zero.h5", "every loss weight is 0 in " + *dir_ / "zero.h5"},
      {*dir_ / "seven.h5", *dir_ / "seven.h5: /loss_weights[" + std::to_string(at) + "] is 7, expected 0 or 1"}};
  for (const auto& [path, named] : bad) {
    const Outcome r = train(out, "--resume none --set data.path=" + path);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(has(r.out, named)) << r.out;
    EXPECT_FALSE(fs::exists(out + "/previous")) << path << ": the finished run was archived before the data check";
    EXPECT_TRUE(fs::exists(out + "/DONE") && fs::exists(out + "/final/model.safetensors")) << path;
    EXPECT_EQ(slurp(out + "/run.json"), run_json) << path;
    EXPECT_EQ(slurp(out + "/metrics.jsonl"), metrics) << path;
  }
  // A fresh folder is not even created for all-zero weights.
  const Outcome r = train(*dir_ / "fresh", "--set data.path=" + *dir_ / "zero.h5");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_FALSE(fs::exists(*dir_ / "fresh/run.json")) << r.out;
}

// SIGUSR1 or SIGTERM within the first 0.3 s of a run (MPI still starting, the config being
// read, the weights and data loading) is a clean stop: exit 0, "stop requested" in the log,
// never the signal's default action (rc 138 for SIGUSR1, 143 for SIGTERM).
TEST_F(TrainFaults, StopSignalInTheFirstMomentsIsACleanStop) {
  const std::string stage = write_stage("long.yaml", "");
  for (int i = 0; i < 6; ++i) {
    const int sig = i % 2 ? SIGTERM : SIGUSR1;
    const int ms = 30 + static_cast<int>(rng_() % 270);
    const std::string out = *dir_ / ("early-" + std::to_string(i));
    const std::string log = *dir_ / ("early-" + std::to_string(i) + ".log");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string bin = bin_dir() + "/easyctx_train", set = "output.dir=" + out, steps = "train.steps=100000";
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::execl(bin.c_str(), bin.c_str(), stage.c_str(), "--set", set.c_str(), "--set", steps.c_str(), nullptr);
      std::_Exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ::kill(pid, sig);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    const std::string text = slurp(log);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << (sig == SIGTERM ? "SIGTERM" : "SIGUSR1") << " after " << ms << " ms: "
        << (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                            : "exit " + std::to_string(WEXITSTATUS(st)))
        << "\n"
        << text;
    EXPECT_TRUE(has(text, "stop requested (")) << text;
  }
}

// Messages a user acts on: --wandb says what the config says; usp's Ulysses size that does not
// divide the heads is named as such; a YAML nested 200,000 deep is an error naming the file and
// the nesting ("bad file" before).
TEST_F(TrainFaults, MessagesNameTheCause) {
  Outcome r = train(*dir_ / "wandb", "--wandb proj --set logging.tensorboard=false --plan");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "--wandb proj: logging.tensorboard is off")) << r.out;
  EXPECT_FALSE(has(r.out, "logging.tensorboard is on")) << r.out;
  // (mpirun from a clean environment: this test process is an MPI singleton itself)
  r = sh(std::string("env -i PATH=\"$PATH\" HOME=\"$HOME\" OMP_NUM_THREADS=1 timeout 120 ") + EASYCTX_MPIEXEC +
         " -np 3 --allow-run-as-root --oversubscribe --bind-to none " + bin_dir() + "/easyctx_train " + stage_ +
         " --set output.dir=" + *dir_ / "usp" +
         " --set parallel.sequence.mode=usp --set parallel.sequence.size=3 --set train.steps=2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "usp: the Ulysses size 3 (parallel.sequence.ulysses_size 0: ") &&
              has(r.out, "must divide the attention heads (4)"))
      << r.out;
  EXPECT_FALSE(has(r.out, "parallel.sequence.size (3) must divide")) << r.out;
  const std::string deep = *dir_ / "deep.yaml";
  write_file_atomic(deep, "train: " + std::string(200000, '[') + std::string(200000, ']') + "\n");
  r = sh(bin_dir() + "/easyctx_train " + deep);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r.out, deep + ":1:")) << r.out;
  EXPECT_TRUE(has(r.out, "nested too deeply")) << r.out;
  EXPECT_FALSE(has(r.out, "bad file")) << r.out;
  const std::string model = *dir_ / "deep-model.yaml";
  write_file_atomic(model, "hidden_size: " + std::string(200000, '[') + std::string(200000, ']') + "\n");
  r = train(*dir_ / "deep-model", "--set model.config=" + model + " --plan");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r.out, model + ":1:") && has(r.out, "nested too deeply")) << r.out;
}

}  // namespace
}  // namespace easyctx::test
