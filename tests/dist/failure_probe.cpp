// Launched by test_failures under mpirun: makes one rank fail in a chosen way so the test can
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
    StageConfig cfg;
    auto layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
    dist::ProcessGroups pg(rt, layout, dist::CommBackend::Mpi, 2.0);
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
