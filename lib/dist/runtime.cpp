#include "dist/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "dist/watchdog.h"

namespace easyctx::dist {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  EASYCTX_THROW(process_label().empty() ? "" : "[" + process_label() + "] ", what,
                " failed: ", std::string(buf, static_cast<size_t>(len)));
}

namespace {
// Every world rank, for the roll call of the start-up collectives.
const std::vector<int>& world_members(int size) {
  static std::vector<int> m;
  if (static_cast<int>(m.size()) != size) {
    m.resize(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) m[static_cast<size_t>(i)] = i;
  }
  return m;
}

// A start-up collective on the world, watched (the default timeout; no config yet).
template <typename Issue>
void world_watched(const char* op, size_t count, Issue issue) {
  fault_point(op, "world");
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Watch w;
  w.op = op;
  w.group = "world";
  w.count = count;
  w.timeout_s = default_collective_timeout_s();
  w.members = &world_members(size);
  MPI_Request q = MPI_REQUEST_NULL;
  check_mpi(issue(&q), op);
  wait_watched(&q, 1, w);
}
}  // namespace

void prefer_isolated_singleton() {
  // A process started without a launcher (no mpirun/srun rank in the environment) is an MPI
  // singleton; Open MPI then forks a daemon of its own, which costs ~0.5 s per start and is
  // needed only for dynamic processes (MPI_Comm_spawn), which easyctx never uses. A value the
  // user set is kept.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "OMPI_MCA_ess_singleton_isolated"})
    if (std::getenv(v) != nullptr) return;
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
}

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    prefer_isolated_singleton();
    // MPI_Init waits for every rank of the launch: a rank that never starts must not hang it.
    WatchdogGuard guard("MPI_Init", "world", 0, default_collective_timeout_s());
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

  {
    WatchdogGuard guard("MPI_Comm_split_type", "world", 0, default_collective_timeout_s());
    check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, topo_.world_rank, MPI_INFO_NULL, &node_comm_),
              "MPI_Comm_split_type");
    // The roll-call side channel (dist/watchdog.h): its own communicator, never mixed with data.
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &roll_call_comm_), "MPI_Comm_dup");
  }
  MPI_Comm_set_errhandler(node_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(roll_call_comm_, MPI_ERRORS_RETURN);
  set_roll_call_comm(roll_call_comm_, {});  // host names follow
  check_mpi(MPI_Comm_rank(node_comm_, &topo_.local_rank), "MPI_Comm_rank(node)");
  check_mpi(MPI_Comm_size(node_comm_, &topo_.local_size), "MPI_Comm_size(node)");

  // Every rank's host name (what a timeout names), then the node index: nodes ordered by
  // their lowest world rank.
  constexpr int kHost = 64;
  std::vector<char> names(static_cast<size_t>(topo_.world_size) * kHost, '\0');
  char mine[kHost] = {0};
  std::snprintf(mine, sizeof mine, "%s", host);
  world_watched("all_gather(host names)", kHost, [&](MPI_Request* q) {
    return MPI_Iallgather(mine, kHost, MPI_CHAR, names.data(), kHost, MPI_CHAR, MPI_COMM_WORLD, q);
  });
  std::vector<std::string> hosts;
  for (int r = 0; r < topo_.world_size; ++r)
    hosts.emplace_back(names.data() + static_cast<size_t>(r) * kHost,
                       strnlen(names.data() + static_cast<size_t>(r) * kHost, kHost));
  set_roll_call_comm(roll_call_comm_, std::move(hosts));

  int leader = topo_.world_rank;
  {
    WatchdogGuard guard("all_reduce(node leader)", "node", 1, default_collective_timeout_s());
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm_), "MPI_Allreduce(node leader)");
  }
  std::vector<int> leaders(static_cast<size_t>(topo_.world_size));
  world_watched("all_gather(node leaders)", 1, [&](MPI_Request* q) {
    return MPI_Iallgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD, q);
  });
  std::set<int> uniq(leaders.begin(), leaders.end());
  topo_.num_nodes = static_cast<int>(uniq.size());
  topo_.node_index = static_cast<int>(std::distance(uniq.begin(), uniq.find(leader)));
}

Runtime::~Runtime() {
  clear_roll_call_comm();
  if (roll_call_comm_ != MPI_COMM_NULL) MPI_Comm_free(&roll_call_comm_);
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
    std::fprintf(stderr, "%s%s%serror: %s\n", who.empty() ? "" : "[", who.c_str(), who.empty() ? "" : "] ",
                 msg.c_str());
    std::fflush(stderr);
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

int run_main(int argc, char** argv, const std::function<int(Runtime&)>& body) {
  ignore_file_size_signal();
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
  } catch (const AgreedFailure&) { throw; } catch (const InputError& e) {
    msg = e.what();
    code = 2;
  } catch (const std::exception& e) {
    msg = e.what();
    code = 1;
  }
  // Both reductions are watched: a rank that stalls inside fn (or never gets here) ends the job
  // within the collective timeout, named by the roll call.
  int mine = code ? rt.rank() : rt.size();
  int first = mine;
  world_watched("run_collectively", 1,
                [&](MPI_Request* q) { return MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, q); });
  if (first == rt.size()) return;
  int worst = code;
  world_watched("run_collectively(failure code)", 1,
                [&](MPI_Request* q) { return MPI_Iallreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, q); });
  if (rt.rank() == first) {
    std::string where = rt.size() > 1 && first != 0 ? "rank " + std::to_string(first) + ": " : "";
    throw AgreedFailure(where + msg, worst, true);
  }
  throw AgreedFailure("", worst, false);
}

}  // namespace easyctx::dist
