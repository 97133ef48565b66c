// Saves one checkpoint (step given) of a known array under mpirun; test_checkpoint_crash
// runs it with EASYCTX_CKPT_CRASH set to kill a rank mid-save.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "dist/runtime.h"

using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    if (argc < 3) EASYCTX_THROW_INPUT("usage: ckpt_probe ROOT STEP");
    std::string root = argv[1];
    int64_t step = std::atoll(argv[2]);
    const int64_t n = 1234;
    std::vector<float> a(n);
    for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = static_cast<float>(std::cos(0.1 * i) + step);
    ckpt::CheckpointWriter w(MPI_COMM_WORLD, root, step);
    int64_t lo = n * rt.rank() / rt.size(), hi = n * (rt.rank() + 1) / rt.size();
    w.add("w", n, lo, a.data() + lo, hi - lo);
    w.commit(Json::object(), 3);
    return 0;
  });
}
