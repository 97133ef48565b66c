// Sharded HDF5 checkpoints: one file per rank per step, an index, and a commit protocol
// that never loses the previous checkpoint.
//
// Layout under <output.dir>/checkpoints:
//   step-00000123/rank-00000.h5 ...   each rank's slices of the global fp32 arrays it owns
//                                     (master weights, Adam m and v per parameter unit), plus
//                                     its per-rank state (RNG, data cursor) as JSON
//   step-00000123/index.json          rank 0: step, metadata (config, layout, model), every
//                                     file's byte size and the slices it holds
//   step-00000123/COMMITTED           written last inside the folder
//   latest                            "step-00000123": moved after the commit
// Protocol: every rank writes its file into step-N.tmp/ and fsyncs it; barrier; rank 0
// writes the index, renames step-N.tmp -> step-N, writes COMMITTED, fsyncs, then moves
// `latest` (write latest.tmp, rename) and only then prunes old steps beyond keep_last. A
// crash or kill at any point leaves the newest committed checkpoint intact and findable.
//
// Arrays are flat fp32 named like "master/layer.3"; each rank saves any [offset, offset+len)
// ranges, and the reader assembles any range from whichever files hold it, so a checkpoint
// written by one rank count / ZeRO group / SP size is read by another (resharding).
// Every dataset carries a CRC32 of its bytes: a corrupt or truncated file is named.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace easyctx::ckpt {

std::string step_dir_name(int64_t step);  // "step-00000123"

class CheckpointWriter {
 public:
  // Collective over `comm` (MPI, host side): every rank constructs it with the same step.
  CheckpointWriter(MPI_Comm comm, std::string root, int64_t step);
  // This rank's slice [offset, offset+length) of global array `name` (global_numel elements).
  void add(const std::string& name, int64_t global_numel, int64_t offset, const float* data, int64_t length);
  // Per-rank state (RNG, data cursor, ...), read back with CheckpointReader::rank_meta.
  void set_rank_meta(const Json& meta) { rank_meta_ = meta; }
  // Writes, syncs and commits (collective). `meta` (rank 0's) goes into index.json.
  // Returns the committed folder.
  std::string commit(const Json& meta, int64_t keep_last);

 private:
  struct Slice {
    std::string name;
    int64_t global_numel, offset, length;
    const float* data;
  };
  MPI_Comm comm_;
  std::string root_;
  int64_t step_;
  int rank_ = 0, size_ = 1;
  std::vector<Slice> slices_;
  Json rank_meta_;
};

struct CheckpointRef {
  std::string path;
  int64_t step = -1;
};

// The newest committed checkpoint under root that passes verification (files present, sizes
// as indexed, every dataset's CRC); broken ones are skipped with a message in `warnings`.
// Returns step -1 when there is none.
CheckpointRef find_latest_checkpoint(const std::string& root, std::vector<std::string>* warnings);

class CheckpointReader {
 public:
  // Opens step folder `path` (must hold COMMITTED and index.json); checks that every rank
  // file is present with its indexed size. Throws InputError naming what is wrong.
  explicit CheckpointReader(std::string path);
  const Json& meta() const { return index_.at("meta"); }
  int64_t step() const { return step_; }
  int world_size() const { return static_cast<int>(files_.size()); }
  const std::string& path() const { return path_; }
  // Global element count of `name` (throws if absent).
  int64_t numel(const std::string& name) const;
  // Assembles [offset, offset+length) of `name` into out from the files that hold it.
  void read(const std::string& name, int64_t offset, int64_t length, float* out) const;
  // The per-rank state written by rank `rank` of the saving run.
  Json rank_meta(int rank) const;
  // Reads every dataset of every file and checks its CRC (throws naming file and dataset).
  void verify() const;

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
};

}  // namespace easyctx::ckpt
