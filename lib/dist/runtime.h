// The process runtime: MPI bootstrap, topology (node, local rank, one GPU per local rank),
// and the app boundary (`run_main`) that turns any exception into one clear line and, when
// several ranks run, MPI_Abort so no rank is left hanging.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include <mpi.h>

namespace easyctx::dist {

struct Topology {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes of this node (MPI_Comm_split_type shared)
  int local_size = 1;
  int node_index = 0;  // 0 .. num_nodes-1, ordered by the lowest world rank on each node
  int num_nodes = 1;
  std::string hostname;
};

class Runtime {
 public:
  // Calls MPI_Init_thread (MPI_THREAD_FUNNELED) unless MPI is already initialised; works
  // without mpirun (a singleton world of one rank).
  Runtime(int* argc, char*** argv);
  ~Runtime();  // MPI_Finalize if this object initialised MPI
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Topology& topology() const { return topo_; }
  int rank() const { return topo_.world_rank; }
  int size() const { return topo_.world_size; }
  MPI_Comm node_comm() const { return node_comm_; }

 private:
  Topology topo_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Comm roll_call_comm_ = MPI_COMM_NULL;  // dist/watchdog.h
  bool owns_mpi_ = false;
};

// Ends every rank now: prints `msg` (if not empty) with this rank's label, then MPI_Abort.
[[noreturn]] void abort_all(const std::string& msg, int code = 1);

// A program's first step (run_main takes it before anything else): SIGXFSZ ignored. A write
// past a file-size limit (`ulimit -f`, RLIMIT_FSIZE, as batch systems set) then fails with
// EFBIG, which every writer reports as an error naming the file, after cutting back what it
// wrote half; at the signal's default the process would die mid-record with nothing said.
void ignore_file_size_signal();

// The app boundary: ignore_file_size_signal(), then creates the Runtime, runs body, catches
// everything. On an exception the
// failing rank prints "error: <message>" (one line) and, with more than one rank, aborts the
// whole job; returns the exit code (0, the body's value, or 1; 2 for bad input).
int run_main(int argc, char** argv, const std::function<int(Runtime&)>& body);

// Thrown by run_collectively on every rank when a collective phase failed somewhere: the
// first failing rank prints the message, every rank exits with the code (no MPI_Abort).
class AgreedFailure : public std::exception {
 public:
  AgreedFailure(std::string msg, int code, bool print) : msg_(std::move(msg)), code_(code), print_(print) {}
  const char* what() const noexcept override { return msg_.c_str(); }
  int code() const { return code_; }
  bool print() const { return print_; }

 private:
  std::string msg_;
  int code_;
  bool print_;
};

// Runs fn on every rank (e.g. loading and validating the config); if it throws on any rank,
// every rank throws AgreedFailure so the job ends with one message and no hang. The agreement
// is watched with dist::default_collective_timeout_s(): a rank that stalls in fn ends the job.
void run_collectively(const Runtime& rt, const std::function<void()>& fn);

// Before MPI_Init of a process started without a launcher (an MPI singleton): asks Open MPI
// not to fork its singleton daemon (OMPI_MCA_ess_singleton_isolated=1, unless set), which
// halves a single process's start-up. Runtime's constructor calls it; so does the tests' main.
void prefer_isolated_singleton();

// Checks an MPI return code; throws easyctx::Error "MPI_X failed: <string>" with rank label.
void check_mpi(int rc, const char* what);

}  // namespace easyctx::dist
