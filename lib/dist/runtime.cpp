#include "dist/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace easyctx::dist {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  EASYCTX_THROW(process_label().empty() ? "" : "[" + process_label() + "] ", what, " failed: ",
                std::string(buf, static_cast<size_t>(len)));
}

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &topo_.world_rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &topo_.world_size), "MPI_Comm_size");

  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  topo_.hostname = host;
  set_process_label(topo_.hostname + ":" + std::to_string(topo_.world_rank));

  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, topo_.world_rank, MPI_INFO_NULL, &node_comm_),
            "MPI_Comm_split_type");
  MPI_Comm_set_errhandler(node_comm_, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(node_comm_, &topo_.local_rank), "MPI_Comm_rank(node)");
  check_mpi(MPI_Comm_size(node_comm_, &topo_.local_size), "MPI_Comm_size(node)");

  // Node index: nodes ordered by their lowest world rank.
  int leader = topo_.world_rank;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm_), "MPI_Allreduce(node leader)");
  std::vector<int> leaders(static_cast<size_t>(topo_.world_size));
  check_mpi(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather(leaders)");
  std::set<int> uniq(leaders.begin(), leaders.end());
  topo_.num_nodes = static_cast<int>(uniq.size());
  topo_.node_index = static_cast<int>(std::distance(uniq.begin(), uniq.find(leader)));
}

Runtime::~Runtime() {
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void abort_all(const std::string& msg, int code) {
  if (!msg.empty()) {
    const std::string& who = process_label();
    std::fprintf(stderr, "%s%s%serror: %s\n", who.empty() ? "" : "[", who.c_str(), who.empty() ? "" : "] ", msg.c_str());
    std::fflush(stderr);
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int run_main(int argc, char** argv, const std::function<int(Runtime&)>& body) {
  std::unique_ptr<Runtime> rt;
  try {
    rt = std::make_unique<Runtime>(&argc, &argv);
    return body(*rt);
  } catch (const AgreedFailure& e) {
    // Every rank failed the same collective phase: one of them prints, all exit cleanly.
    if (e.print()) {
      std::fprintf(stderr, "error: %s\n", e.what());
      std::fflush(stderr);
    }
    return e.code();
  } catch (const InputError& e) {
    if (!rt || rt->size() == 1) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
    abort_all(e.what(), 2);
  } catch (const std::exception& e) {
    if (!rt || rt->size() == 1) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
    abort_all(e.what(), 1);
  }
}

void run_collectively(const Runtime& rt, const std::function<void()>& fn) {
  std::string msg;
  int code = 0;
  try {
    fn();
  } catch (const AgreedFailure&) {
    throw;
  } catch (const InputError& e) {
    msg = e.what();
    code = 2;
  } catch (const std::exception& e) {
    msg = e.what();
    code = 1;
  }
  int mine = code ? rt.rank() : rt.size();
  int first = mine;
  check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce(failure check)");
  if (first == rt.size()) return;
  int worst = code;
  check_mpi(MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(failure code)");
  if (rt.rank() == first) {
    std::string where = rt.size() > 1 && first != 0 ? "rank " + std::to_string(first) + ": " : "";
    throw AgreedFailure(where + msg, worst, true);
  }
  throw AgreedFailure("", worst, false);
}

}  // namespace easyctx::dist
