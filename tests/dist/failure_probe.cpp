// Launched by test_failures and test_hangs under mpirun: makes one rank fail in a chosen way
// (the mode, or EASYCTX_FAULT before a chosen collective: dist/watchdog.h) so the test can
// check that every rank ends, with one clear message, instead of hanging.
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/groups.h"
#include "dist/runtime.h"

using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "bad-input-all") {
      dist::run_collectively(rt, [] { EASYCTX_THROW_INPUT("stage.yaml:3:5: train.lr: bad value 'x'"); });
      return 0;
    }
    if (mode == "bad-input-one") {
      dist::run_collectively(rt, [&] {
        if (rt.rank() == 1) EASYCTX_THROW_INPUT("shard-0001.h5: vocab_size 32000 != model vocab 128256");
      });
      return 0;
    }
    if (mode == "collective-phase") {  // a start-up phase (EASYCTX_FAULT stalls a rank before it)
      dist::run_collectively(rt, [] {});
      return 0;
    }
    StageConfig cfg;
    auto layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
    dist::ProcessGroups pg(rt, layout, dist::CommBackend::Mpi, 2.0);
    if (mode == "ops") {  // every collective on 'dp' (the 2 ranks), then on 'world'; EASYCTX_FAULT stalls one
      dist::Comm& c = pg.dp();
      const int peer = 1 - c.rank();
      float f[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8] = {0};
      int32_t i = rt.rank();
      c.all_reduce(f, 4);
      c.all_reduce(&i, 1, dist::ReduceOp::Max);
      c.reduce_scatter(f, g, 4);
      c.all_gather(f, g, 4);
      c.broadcast(f, 4, 0);
      c.send_recv(f, 4, peer, g, 4, peer);
      c.all_to_all(f, g, 4);
      c.barrier();
      c.all_reduce_scalar(1.0, dist::ReduceOp::Sum);
      pg.world().barrier();
      return 0;
    }
    if (mode == "mismatch") {  // rank 1 calls another collective than rank 0
      float x = 1;
      if (rt.rank() == 1) pg.world().barrier();
      else pg.dp().all_reduce(&x, 1);
      return 0;
    }
    if (mode == "hang") {
      if (rt.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins
      float x = 1;
      pg.dp().all_reduce(&x, 1);
      return 0;
    }
    if (mode == "throw-one") {
      if (rt.rank() == 1) EASYCTX_THROW("boom on rank 1");
      pg.world().barrier();
      return 0;
    }
    EASYCTX_THROW_INPUT("unknown mode '", mode, "'");
  });
}
