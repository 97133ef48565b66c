// The synchronisation points of a checkpoint save or load: every rank reports to rank 0, rank 0
// answers every rank. Point-to-point on a private duplicate of the communicator, polled against
// a deadline (parallel.collective_timeout_s), so that a rank that stalls or dies during a save is
// named instead of hanging the job: rank 0 names the ranks whose report is missing, the others
// name rank 0 when its answer is missing (after a short grace, so that rank 0, which knows more,
// speaks first). Either way every rank is aborted (dist::abort_all, exit code 3, as the
// collective watchdog does).
#pragma once
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace easyctx::ckpt {

class RankSync {
 public:
  // Collective over comm (its duplicate is made under the collective watchdog). `what` names the
  // operation in messages ("checkpoint step 120").
  RankSync(MPI_Comm comm, double timeout_s, std::string what);
  ~RankSync();
  RankSync(const RankSync&) = delete;
  RankSync& operator=(const RankSync&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }

  // Every rank's `mine` reaches rank 0 (returned there in rank order; empty elsewhere). `doing`
  // says what a missing rank was doing ("writing its checkpoint file").
  std::vector<std::string> gather(const std::string& mine, const std::string& doing);
  // Rank 0's `msg` reaches every rank (returned on every rank; other ranks' argument is ignored).
  std::string bcast(const std::string& msg, const std::string& doing);
  // gather, then `decide` on rank 0 over the reports (`deciding` says what it does), then bcast
  // of its answer. An exception from `decide` is thrown on every rank.
  std::string reduce(const std::string& mine, const std::string& doing, const std::string& deciding,
                     const std::function<std::string(const std::vector<std::string>&)>& decide);

 private:
  [[noreturn]] void timed_out(const std::string& msg) const;
  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_;
  std::string what_;
  int rank_ = 0, size_ = 1;
  int seq_ = 0;  // one tag per exchange: every rank makes the same exchanges in the same order
};

}  // namespace easyctx::ckpt
