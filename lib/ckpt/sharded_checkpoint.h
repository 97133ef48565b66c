// Sharded HDF5 checkpoints: one file per rank per step, an index, and a commit protocol
// that never loses the previous checkpoint.
//
// Layout under <output.dir>/checkpoints:
//   step-00000123/rank-00000.h5 ...   each rank's slices of the global fp32 arrays it owns
//                                     (master weights, Adam m and v per parameter unit), plus
//                                     its per-rank state (RNG, data cursor) as JSON
//   step-00000123/index.json          rank 0: step, run id, metadata (config, layout, model),
//                                     every file's byte size, the slices it holds and their CRC32
//   step-00000123/COMMITTED           written last inside the folder: the step and the index's CRC32
//   latest                            "step-00000123": moved after the commit
// Protocol (docs/training.md, "Checkpoint safety"):
//   1. rank 0 looks at the step's folder: a committed, verified checkpoint of this run there
//      means the save is skipped (a step's state is unique within a run); an uncommitted
//      leftover is removed; anything else committed is left where it is until step 3.
//   2. every rank writes its file into step-N.tmp/, fsyncs it, drops it from the page cache and
//      reads it back against the CRCs of what it meant to write, then reports to rank 0;
//   3. rank 0 writes the index, fsyncs, moves a committed checkpoint still at step-N (another
//      run's, or a broken one) to the aside folder (never deleting it), renames step-N.tmp ->
//      step-N, writes COMMITTED, fsyncs, moves `latest`, and tells every rank;
//   4. only then rank 0 prunes: this run's checkpoints older than the new one beyond keep_last
//      (other runs' checkpoints are never pruned), and stale temporary folders.
// A crash or kill at any point leaves the newest committed checkpoint intact and findable;
// a failed write (full disk) is an error on every rank that leaves it intact too. The
// exchanges with rank 0 run under parallel.collective_timeout_s (ckpt/rank_sync.h): a rank that
// stalls is named and the job aborted.
//
// Arrays are flat fp32 named like "master/layer.3" (array_name below); each rank saves any
// [offset, offset+len) ranges, and the reader assembles any range from whichever files hold it, so a checkpoint
// written by one rank count / ZeRO group / SP size is read by another (resharding).
// Every dataset and every file's rank state carries a CRC32, the index's is in COMMITTED:
// a corrupt, truncated or missing file is named.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"

namespace easyctx::ckpt {

class RankSync;

// The arrays of a training checkpoint, one of each kind per parameter unit, named
// "<kind>/<unit>" ("master/layer.3", "adam_m/layer.3"): the fp32 master weights (the model: all
// that evaluation, conversion and model.init without model.carry_optimizer read) and the Adam
// moments (read only to continue training: resume, model.carry_optimizer). Writers and loaders
// name arrays through array_name; this is the one place that spells the kinds.
enum class ArrayKind { Master, AdamM, AdamV };
std::string array_name(ArrayKind kind, const std::string& unit);
// Whether array `name` holds model weights (kind Master, "master/..."); anything else (the Adam
// moments, or an array of another writer) is not.
bool is_weight_array(const std::string& name);

// What a verification reads and checks against the CRC32s of the index. Either way every rank
// file must be present with its indexed size (CheckpointReader's constructor) and the index
// must match the checksum in COMMITTED.
enum class VerifyScope {
  // Every dataset of every file and each file's rank state: what a resume loads (and what a
  // save that finds its step committed keeps).
  Everything,
  // The weight arrays only (is_weight_array): what a load of the model alone reads (evaluation,
  // easyctx_convert, model.init without model.carry_optimizer). The Adam moments, two thirds
  // of a training checkpoint's bytes, and the rank states are neither read nor checked, so
  // damage there does not make such a consumer skip the checkpoint.
  Weights,
};

std::string step_dir_name(int64_t step);  // "step-00000123"
// The step of a step folder's name ("step-00000123" -> 123), -1 for any other name.
int64_t step_of_dir(const std::string& name);

// Fault injection for tests, at the named points of a save and of the trainer's start-up:
// EASYCTX_FAULT=<point>[@<step>][:<rank>[:<action>]] (EASYCTX_CKPT_CRASH is the older name) acts
// when rank `rank` (any rank when empty) reaches `point` (of the save of step `step`, when
// given). Actions: kill (the default: SIGKILL, no cleanup), term and usr1 (raise SIGTERM or
// SIGUSR1: a stop request), stall (sleep for an hour: a stuck rank). Without the variable it
// costs one getenv.
void fault_point(const char* point, int rank, int64_t step = -1);

struct WriterOptions {
  // Stored in the index. Pruning and the same-step check consider only checkpoints of this
  // run ("" = unlabelled, as written before run ids existed).
  std::string run_id;
  std::string config_hash;
  // Where a committed checkpoint found at the step being saved that is not this run's (or is
  // broken) goes, as <aside_dir>/<its run id>/checkpoints/step-N; default <root>/aside.
  std::string aside_dir;
  // parallel.collective_timeout_s for the exchanges with rank 0.
  double timeout_s = 600;
};

class CheckpointWriter {
 public:
  // Collective over `comm` (MPI, host side): every rank constructs it with the same step.
  CheckpointWriter(MPI_Comm comm, std::string root, int64_t step, WriterOptions opts = {});
  ~CheckpointWriter();
  // This rank's slice [offset, offset+length) of global array `name` (global_numel elements).
  void add(const std::string& name, int64_t global_numel, int64_t offset, const float* data, int64_t length);
  // Per-rank state (RNG, data cursor, ...), read back with CheckpointReader::rank_meta.
  void set_rank_meta(const Json& meta) { rank_meta_ = meta; }
  // Writes, syncs, verifies and commits (collective), then prunes to keep_last of this run.
  // `meta` (rank 0's) goes into index.json. Returns the committed folder. Throws on every rank
  // (naming the rank and file) when a rank could not write; the previous checkpoint is intact.
  std::string commit(const Json& meta, int64_t keep_last);
  // After commit: the step was already committed and verified for this run, nothing written.
  bool skipped() const { return skipped_; }

 private:
  struct Slice {
    std::string name;
    int64_t global_numel, offset, length;
    const float* data;
  };
  std::string prepare();  // step 1 on rank 0: "skip", "new", "replace"
  Json write_own_file(std::string& err);
  std::string commit_on_root(const std::vector<std::string>& reports, const std::string& state, const Json& meta);
  void prune(int64_t keep_last);

  MPI_Comm comm_;
  std::string root_;
  int64_t step_;
  WriterOptions opts_;
  int rank_ = 0, size_ = 1;
  std::vector<Slice> slices_;
  Json rank_meta_;
  std::unique_ptr<RankSync> sync_;
  bool skipped_ = false;
};

struct CheckpointRef {
  std::string path;
  int64_t step = -1;
};

// A committed step folder as listed (its index read, not verified).
struct CheckpointEntry {
  std::string path;
  int64_t step = -1;
  std::string run_id;   // from its index; "" when unlabelled (or when the index is unreadable)
  std::string problem;  // the index could not be read: why (such an entry is broken; its files
                        // are not checked here)
};
// The committed step folders directly under root, newest step first.
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// The newest committed checkpoint under root that passes verification (files present, sizes
// as indexed, every dataset's CRC: VerifyScope::Everything); broken ones are skipped with a
// message in `warnings`.
// Returns step -1 when there is none.
CheckpointRef find_latest_checkpoint(const std::string& root, std::vector<std::string>* warnings);

class CheckpointReader {
 public:
  // Opens step folder `path` (must hold COMMITTED and index.json); checks that every rank
  // file is present with its indexed size. Throws InputError naming what is wrong.
  explicit CheckpointReader(std::string path);
  const Json& meta() const { return index_.at("meta"); }
  int64_t step() const { return step_; }
  // The run that wrote it ("" for checkpoints from before run ids) and its config hash.
  std::string run_id() const;
  std::string config_hash() const;
  int world_size() const { return static_cast<int>(files_.size()); }
  const std::string& path() const { return path_; }
  // Global element count of `name` (throws if absent).
  int64_t numel(const std::string& name) const;
  // Assembles [offset, offset+length) of `name` into out from the files that hold it (only
  // those elements are read).
  void read(const std::string& name, int64_t offset, int64_t length, float* out) const;
  // Bytes of arrays read by read() so far (4 per element; verification not counted).
  uint64_t bytes_read() const { return bytes_read_; }
  // The per-rank state written by rank `rank` of the saving run.
  Json rank_meta(int rank) const;
  // Reads the datasets `scope` covers (every one by default; the weight arrays only for
  // VerifyScope::Weights) of every file and checks their CRCs, and with Everything each file's
  // rank state; throws InputError naming the file and the dataset (with its array name).
  void verify(VerifyScope scope = VerifyScope::Everything) const { verify_files(0, 1, scope); }
  // The same for files first, first + stride, ... (a share of a collective verification).
  void verify_files(int first, int stride, VerifyScope scope = VerifyScope::Everything) const;

 private:
  struct FileSlice {
    int file;
    std::string name;
    int64_t global_numel, offset, length;
  };
  std::string path_;
  Json index_;
  int64_t step_ = -1;
  std::vector<std::string> files_;
  std::vector<FileSlice> slices_;
  mutable uint64_t bytes_read_ = 0;
};

// Collective over sync's ranks: every rank verifies a share of the files of the checkpoint at
// `path` (CheckpointReader + verify_files with `scope`). Returns "" when it is intact, else
// what is wrong (naming file and dataset), the same string on every rank. When intact and
// `ref` is given, *ref is the checkpoint (its path and the step its index records).
std::string verify_collectively(RankSync& sync, const std::string& path, CheckpointRef* ref = nullptr,
                                VerifyScope scope = VerifyScope::Everything);

// What this process's verifications (CheckpointReader::verify_files) have covered so far: the
// files of its shares, the datasets it read and checked, and their bytes. For tests that the
// work is shared between ranks rather than repeated on each, and that VerifyScope::Weights
// reads only the weights.
uint64_t verified_file_count();
uint64_t verified_dataset_count();
uint64_t verified_byte_count();

}  // namespace easyctx::ckpt
