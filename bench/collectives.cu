// bench_collectives: NCCL bus bandwidth of all-reduce, all-gather and reduce-scatter through
// easyctx's Comm (the path training uses), 1 MiB .. 1 GiB, with nccl-tests accounting:
//   algbw = bytes / time;  busbw = algbw * 2(n-1)/n (all-reduce), * (n-1)/n (gather, scatter)
// where bytes is the full buffer (all-gather: the gathered output; reduce-scatter: the input).
// Run: mpirun -np <GPUs> build/bin/bench_collectives [--min-mib 1] [--max-mib 1024] [--iters 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/cuda_queue.h"
#include "dist/comm_nccl.h"
#include "dist/groups.h"
#include "dist/runtime.h"

using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    double min_mib = 1, max_mib = 1024;
    int iters = 20, warmup = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string a = argv[i];
      if (a == "--min-mib") min_mib = std::atof(argv[i + 1]);
      else if (a == "--max-mib") max_mib = std::atof(argv[i + 1]);
      else if (a == "--iters") iters = std::atoi(argv[i + 1]);
      else EASYCTX_THROW_INPUT("unknown flag ", a);
    }
    StageConfig cfg;
    auto layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
    dist::ProcessGroups pg(rt, layout, dist::CommBackend::Nccl, 300.0);
    dist::Comm& c = pg.world();
    const int n = c.size();
    size_t max_bytes = static_cast<size_t>(max_mib * 1024 * 1024);
    void *a = nullptr, *b = nullptr;
    dist::check_cuda(cudaMalloc(&a, max_bytes), "cudaMalloc");
    dist::check_cuda(cudaMalloc(&b, max_bytes), "cudaMalloc");
    dist::check_cuda(cudaMemset(a, 0x3c, max_bytes), "cudaMemset");  // 0x3c3c: a finite bf16/f32 pattern
    cudaEvent_t e0, e1;
    dist::check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
    dist::check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
    cudaStream_t stream = nullptr;  // the bench's own stream, lent to the communicator
    dist::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_queue::StreamQueue queue(stream);
    c.set_queue(&queue);
    cudaDeviceProp prop;
    dist::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (rt.rank() == 0) {
      std::printf("# bench_collectives: %d x %s, NCCL through easyctx Comm, f32 sum, %d iters (median of 3 runs)\n", n,
                  prop.name, iters);
      std::printf("| op | size | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---|---|---|---|---|\n");
    }
    const char* ops[] = {"all_reduce", "all_gather", "reduce_scatter"};
    for (int op = 0; op < 3; ++op) {
      for (size_t bytes = static_cast<size_t>(min_mib * 1024 * 1024); bytes <= max_bytes; bytes *= 2) {
        size_t count = bytes / 4;  // f32 elements in the full buffer
        auto launch = [&] {
          if (op == 0) c.all_reduce(a, b, count, dist::DType::F32, dist::ReduceOp::Sum);
          else if (op == 1) c.all_gather(a, b, count / static_cast<size_t>(n), dist::DType::F32);
          else c.reduce_scatter(a, b, count / static_cast<size_t>(n), dist::DType::F32, dist::ReduceOp::Sum);
        };
        for (int w = 0; w < warmup; ++w) launch();
        c.synchronize();
        std::vector<float> runs;
        for (int rep = 0; rep < 3; ++rep) {
          c.barrier();
          dist::check_cuda(cudaEventRecord(e0, stream), "cudaEventRecord");
          for (int it = 0; it < iters; ++it) launch();
          dist::check_cuda(cudaEventRecord(e1, stream), "cudaEventRecord");
          c.synchronize();
          float ms = 0;
          dist::check_cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
          runs.push_back(ms / static_cast<float>(iters));
        }
        std::sort(runs.begin(), runs.end());
        double sec = runs[1] * 1e-3;
        double algbw = static_cast<double>(bytes) / sec / 1e9;
        double factor = op == 0 ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        if (rt.rank() == 0)
          std::printf("| %s | %.0f MiB | %.1f | %.1f | %.1f |\n", ops[op], static_cast<double>(bytes) / (1 << 20),
                      sec * 1e6, algbw, algbw * factor);
      }
    }
    c.set_queue(nullptr);  // its own stream again before ours goes
    cudaFree(a);
    cudaFree(b);
    return 0;
  });
}
