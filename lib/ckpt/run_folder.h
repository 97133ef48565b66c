// Run identity: which training run an output folder holds, so that resuming, pruning and the
// end-of-stage export only ever touch that run's checkpoints (docs/training.md, "Checkpoint
// safety").
//
// A run is one line of training states in one output.dir. It gets a random id when it starts
// (`--resume none`, a fresh folder, or a fork from another checkpoint); the id is written to
// <output.dir>/run.json before anything of the run is, and into the index of every checkpoint it
// commits. `--resume auto` continues the run named by run.json; pruning deletes only that run's
// checkpoints. Checkpoints of other runs in the same folder are left where they are (listed,
// never pruned); one found at a step being saved is moved to <output.dir>/previous/<its run>/.
// When a new run starts in a folder that held another, that run's DONE, final/ and
// metrics.jsonl move to previous/<its id>/ (run.json records the move until it is done, so an
// interrupted start finishes it).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ckpt/sharded_checkpoint.h"
#include "core/json.h"

namespace easyctx::ckpt {

struct RunInfo {
  std::string run_id;
  std::string config_hash;  // of the training-relevant config the run started with
  std::string started;      // UTC, ISO 8601
  // Checkpoints without a run id (written before run ids existed) count as this run's: set when
  // `--resume auto` continued such a checkpoint.
  bool adopts_unlabelled = false;
  Json origin;  // how it started: {"from": "model.init", ...} or {"from": checkpoint path, "step", "run_id"}
  // A start in progress: the earlier run (its run.json) whose DONE, final/ and metrics.jsonl are
  // still to be moved to previous/<its id>/, and whether its metrics are copied (this run
  // continues its history) instead of moved.
  std::string archive_of;
  Json archive_info;
  bool archive_keeps_metrics = false;
  std::vector<std::string> earlier_runs;  // ids of the runs this folder held before, oldest first
};

// <run_dir>/run.json: nullopt when absent; InputError naming the file when unreadable.
std::optional<RunInfo> read_run_info(const std::string& run_dir);
// Writes it atomically and syncs it (and the folder).
void write_run_info(const std::string& run_dir, const RunInfo& info);
RunInfo run_info_from_json(const Json& j, const std::string& source);
Json run_info_to_json(const RunInfo& info);
// 16 random hex digits.
std::string new_run_id();
std::string utc_now();

// Whether a checkpoint whose index names `ckpt_run_id` is one of `run`'s.
bool belongs_to(const std::string& ckpt_run_id, const RunInfo& run);

// What a load of `spec` considers, newest first, as listed (not yet verified): a step folder is
// itself; a run folder means its checkpoints/ (or the folder itself when it has none) and, when
// it has a run.json, only that run's checkpoints; `note` then names what was left out.
std::vector<CheckpointEntry> checkpoint_candidates(const std::string& spec, std::string* note);

// Single process (easyctx_convert, tests): the newest candidate of `spec` that verifies (in
// `scope`: a consumer that loads only the model passes VerifyScope::Weights), the broken ones
// skipped with a line each in `warnings`. Step -1 when there is no candidate; InputError naming
// every broken one when none verifies.
CheckpointRef resolve_verified(const std::string& spec, std::vector<std::string>* warnings,
                               VerifyScope scope = VerifyScope::Everything);

// The same, collective over sync's ranks (every rank calls it with the same spec), for jobs
// whose ranks all load the same whole checkpoint (the evaluation programs): rank 0 lists the
// candidates (one view of the folder, so a checkpoint committed meanwhile cannot make ranks
// disagree) and each candidate's files are verified once, each by one rank
// (verify_collectively), instead of every file by every rank. Every rank returns the same
// checkpoint and warnings, or throws the same exception (InputError naming the file and
// dataset when none verifies). The evaluation programs pass VerifyScope::Weights: they read
// the master weights only.
CheckpointRef resolve_verified(RankSync& sync, const std::string& spec, std::vector<std::string>* warnings,
                               VerifyScope scope = VerifyScope::Everything);

// Collective over sync's ranks (every rank passes the same paths, newest first): verifies them
// in turn (verify_collectively, in `scope`) up to the first intact one and returns its index,
// or -1 when none is; *problems gets what is wrong with each broken one before it, in order,
// and *ref (optional) the intact checkpoint. The same on every rank. The one loop behind the
// trainer's start (resume: Everything; model.init: Weights unless model.carry_optimizer) and
// resolve_verified above, which word their messages themselves.
int first_verified(RankSync& sync, const std::vector<std::string>& paths, std::vector<std::string>* problems,
                   CheckpointRef* ref = nullptr, VerifyScope scope = VerifyScope::Everything);

// Moves the earlier run's DONE, final/, plan.json and run.json record (info, its run.json) to
// <run_dir>/previous/<old_id>/, and copies (keep_metrics) or moves its metrics.jsonl and
// tensorboard/ there.
// Idempotent: what is already moved is skipped.
void archive_run(const std::string& run_dir, const std::string& old_id, const Json& info, bool keep_metrics);

}  // namespace easyctx::ckpt
