#include "ckpt/rank_sync.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/strings.h"
#include "dist/runtime.h"
#include "dist/watchdog.h"

namespace easyctx::ckpt {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `done` until it holds or `deadline` passes (false then); the wait grows from 50 us to
// 20 ms, so a quick exchange costs little and a long one little CPU.
template <typename F>
bool poll_until(Clock::time_point deadline, F done) {
  auto nap = std::chrono::microseconds(50);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(20));
  }
  return true;
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string seconds_text(double s) {
  return s == static_cast<double>(static_cast<long>(s)) ? std::to_string(static_cast<long>(s)) : std::to_string(s);
}

}  // namespace

RankSync::RankSync(MPI_Comm comm, double timeout_s, std::string what) : timeout_s_(timeout_s), what_(std::move(what)) {
  dist::check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
  dist::check_mpi(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  if (size_ == 1) return;
  dist::WatchdogGuard g("MPI_Comm_dup", what_, 0, timeout_s_);
  dist::check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
}

RankSync::~RankSync() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void RankSync::timed_out(const std::string& msg) const { dist::abort_all(what_ + ": " + msg, 3); }

std::vector<std::string> RankSync::gather(const std::string& mine, const std::string& doing) {
  const int tag = 1000 + (seq_++ % 30000);
  if (size_ == 1) return {mine};
  // Rank 0 answers a little later than it waits, so that when a third rank stalls, rank 0
  // (which knows which one) is the first to give up.
  const double grace = std::min(30.0, std::max(1.0, 0.1 * timeout_s_));
  if (rank_ != 0) {
    MPI_Request req;
    dist::check_mpi(MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, 0, tag, comm_, &req), "MPI_Isend");
    if (!poll_until(after(timeout_s_ + grace), [&] {
          int flag = 0;
          dist::check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
          return flag != 0;
        }))
      timed_out("rank 0 did not take rank " + std::to_string(rank_) + "'s report (" + doing + ") within " +
                seconds_text(timeout_s_ + grace) +
                " s (parallel.collective_timeout_s + grace): rank 0 stalled or "
                "died; aborting every rank");
    return {};
  }
  std::vector<std::string> out(static_cast<size_t>(size_));
  std::vector<char> got(static_cast<size_t>(size_), 0);
  out[0] = mine;
  got[0] = 1;
  int left = size_ - 1;
  const bool done = poll_until(after(timeout_s_), [&] {
    for (int r = 1; r < size_; ++r) {
      if (got[static_cast<size_t>(r)]) continue;
      int flag = 0;
      MPI_Status st;
      dist::check_mpi(MPI_Iprobe(r, tag, comm_, &flag, &st), "MPI_Iprobe");
      if (!flag) continue;
      int n = 0;
      dist::check_mpi(MPI_Get_count(&st, MPI_CHAR, &n), "MPI_Get_count");
      std::string& s = out[static_cast<size_t>(r)];
      s.resize(static_cast<size_t>(n));
      dist::check_mpi(MPI_Recv(s.data(), n, MPI_CHAR, r, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
      got[static_cast<size_t>(r)] = 1;
      --left;
    }
    return left == 0;
  });
  if (!done) {
    std::string missing;
    for (int r = 1; r < size_; ++r)
      if (!got[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    timed_out(std::string(left > 1 ? "ranks " : "rank ") + missing + " did not finish " + doing + " within " +
              seconds_text(timeout_s_) +
              " s of rank 0 (parallel.collective_timeout_s): stalled or dead; aborting "
              "every rank");
  }
  return out;
}

std::string RankSync::bcast(const std::string& msg, const std::string& doing) {
  const int tag = 1000 + (seq_++ % 30000);
  if (size_ == 1) return msg;
  const double grace = std::min(30.0, std::max(1.0, 0.1 * timeout_s_));
  if (rank_ == 0) {
    std::vector<MPI_Request> reqs(static_cast<size_t>(size_ - 1));
    for (int r = 1; r < size_; ++r)
      dist::check_mpi(MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, r, tag, comm_,
                                &reqs[static_cast<size_t>(r - 1)]),
                      "MPI_Isend");
    std::vector<MPI_Status> sts(reqs.size());
    if (!poll_until(after(timeout_s_), [&] {
          int flag = 0;
          dist::check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, sts.data()), "MPI_Testall");
          return flag != 0;
        }))
      timed_out("a rank did not take rank 0's answer (" + doing + ") within " + seconds_text(timeout_s_) +
                " s (parallel.collective_timeout_s): stalled or dead; aborting every rank");
    return msg;
  }
  std::string out;
  MPI_Status st;
  if (!poll_until(after(timeout_s_ + grace), [&] {
        int flag = 0;
        dist::check_mpi(MPI_Iprobe(0, tag, comm_, &flag, &st), "MPI_Iprobe");
        return flag != 0;
      }))
    timed_out("no answer from rank 0 (" + doing + ") within " + seconds_text(timeout_s_ + grace) +
              " s (parallel.collective_timeout_s + grace): rank 0 stalled or died; aborting every rank");
  int n = 0;
  dist::check_mpi(MPI_Get_count(&st, MPI_CHAR, &n), "MPI_Get_count");
  out.resize(static_cast<size_t>(n));
  dist::check_mpi(MPI_Recv(out.data(), n, MPI_CHAR, 0, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  return out;
}

std::string RankSync::reduce(const std::string& mine, const std::string& doing, const std::string& deciding,
                             const std::function<std::string(const std::vector<std::string>&)>& decide) {
  std::vector<std::string> all = gather(mine, doing);
  // A failure of `decide` reaches every rank as the same exception (marked by a leading \x01,
  // \x02 for bad input), never as a rank 0 that stops answering.
  std::string answer;
  if (rank_ == 0) try {
      answer = decide(all);
    } catch (const InputError& e) { answer = std::string("\x02") + e.what(); } catch (const std::exception& e) {
      answer = std::string("\x01") + e.what();
    }
  answer = bcast(answer, deciding);
  if (!answer.empty() && answer[0] == '\x02') EASYCTX_THROW_INPUT(answer.substr(1));
  if (!answer.empty() && answer[0] == '\x01') EASYCTX_THROW(answer.substr(1));
  return answer;
}

}  // namespace easyctx::ckpt
