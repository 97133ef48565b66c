// bench_forward: forward-only speed and memory of the evaluation session (lib/eval/session.h)
// on one sequence of random tokens per length, beside ../shared/bench/peer_hf_forward.py
// (Hugging Face transformers, bf16, SDPA, no cache, no grad: its loss scores every position,
// as --score all does here). One JSON line per length, then the memory plan beside the
// measured peak (allocations; lengths run in the order given, so give them ascending: the
// peak is the process's so far).
//   bench_forward --model random:llama2-7b --tokens 32768,131072 [--reps 2] [--device cuda]
//                 [--sp-size N --sp-mode M] [--attention-head-groups G] [--mlp-tile N]
//                 [--lm-head-tile N] [--score all|last]
// Under mpirun the session is sequence parallel over --sp-size ranks (the job's ranks must
// equal it: one sequence).
#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "eval/eval_plan.h"
#include "eval/session.h"
#include "plan/target.h"

namespace po = boost::program_options;
using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    eval::SessionOptions o;
    std::string device = "auto", sp_mode = "zigzag_ring", tokens = "32768,131072", score = "all";
    int reps = 2;
    po::options_description opts("bench_forward [options]");
    opts.add_options()("help,h", "show this help")("model", po::value(&o.model)->default_value("random:llama2-7b"),
                                                   "HF folder, ckpt:DIR or random:SPEC")(
        "tokens", po::value(&tokens)->default_value(tokens), "sequence lengths, comma-separated (ascending)")(
        "reps", po::value(&reps)->default_value(2),
        "timed passes per length (after one warm-up); the median is reported")(
        "device", po::value(&device)->default_value("auto"), "auto | cpu | cuda")(
        "sp-size", po::value(&o.sp_size)->default_value(1), "ranks per sequence")(
        "sp-mode", po::value(&sp_mode)->default_value("zigzag_ring"), "zigzag_ring | ulysses | dist_flash | usp")(
        "attention-head-groups", po::value(&o.attention_head_groups)->default_value(1), "attention head groups")(
        "mlp-tile", po::value(&o.mlp_tile)->default_value(16384), "tokens per MLP tile")(
        "lm-head-tile", po::value(&o.lm_head_tile)->default_value(4096), "tokens per LM-head tile")(
        "rope-theta", po::value(&o.rope_theta)->default_value(1e6), "RoPE base (the peer uses 1e6)")(
        "score", po::value(&score)->default_value("all"),
        "all: every prediction (a perplexity pass, as the peer's loss); last: the last one only (a needle cell)");
    po::variables_map vm;
    dist::run_collectively(rt, [&] {
      try {
        po::store(po::parse_command_line(argc, argv, opts), vm);
        po::notify(vm);
      } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
      o.device = eval::parse_device(device);
      o.sp_mode = eval::parse_sp_mode(sp_mode);
      EASYCTX_CHECK_INPUT(score == "all" || score == "last", "--score: expected all or last, got ", score);
      EASYCTX_CHECK_INPUT(rt.size() == o.sp_size, "bench_forward: run it on --sp-size ranks (", o.sp_size, "), got ",
                          rt.size());
    });
    if (vm.count("help")) {
      if (rt.rank() == 0) std::cout << opts;
      return 0;
    }
    LogOptions lo;
    lo.rank = rt.rank();
    log_init(lo);
    std::vector<int64_t> lengths;
    for (const std::string& t : split(tokens, ',')) lengths.push_back(std::stoll(t));
    auto comm = dist::make_comm(MPI_COMM_WORLD, "world", dist::CommBackend::Mpi, 3600);
    const auto t_open = std::chrono::steady_clock::now();
    const std::unique_ptr<eval::Session> s = eval::open_session(o, *comm);
    const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_open).count();
    log_info("bench_forward: ", s->describe(), " (loaded in ", format_duration(open_s), ")");
    std::mt19937_64 rng(7);
    for (int64_t n : lengths) {
      const plan::MemoryPlan p = eval::plan_session(o, n, {}, rt.size(), rt.topology().local_size);
      eval::ScoreRequest r;
      r.tokens.resize(static_cast<size_t>(n));
      for (auto& t : r.tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(s->vocab_size()));
      r.spans = {score == "all" ? eval::ScoreRequest::Span{0, n - 1} : eval::ScoreRequest::Span{n - 2, 1}};
      std::vector<double> secs;
      double nll = 0;
      for (int i = 0; i <= reps; ++i) {
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        const auto out = s->score_spans({r});
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        nll = out[0][0].sum_nll / static_cast<double>(std::max<int64_t>(1, out[0][0].count));
      }
      std::vector<double> timed(secs.begin() + 1, secs.end());
      std::sort(timed.begin(), timed.end());
      const double t = timed.empty() ? secs[0] : timed[timed.size() / 2];
      const eval::SessionStats st = s->stats();
      const double gib = 1024.0 * 1024.0 * 1024.0;
      if (rt.rank() == 0) {
        std::printf(
            "{\"system\":\"easyctx_forward\",\"model\":\"%s\",\"seq\":%lld,\"sp\":%d,\"score\":\"%s\",\"s\":%.3f,"
            "\"tokens_per_s\":%.0f,\"mean_nll\":%.4f,\"peak_gib\":%.1f,\"plan_peak_gib\":%.1f,"
            "\"plan_device_gib\":%.1f,\"device_used_gib\":%.1f,\"warmup_s\":%.3f}\n",
            o.model.c_str(), static_cast<long long>(n), o.sp_size, score.c_str(), t, n / t, nll,
            st.alloc_peak_bytes / gib, p.alloc_peak_bytes / gib, p.gpu_peak_bytes / gib, st.device_used_bytes / gib,
            secs[0]);
        std::fflush(stdout);
        log_info("seq ", n, ": ",
                 plan::compare_line(p, {0, st.alloc_peak_bytes, 0}, static_cast<double>(plan::vm_hwm_bytes()),
                                    st.device_used_bytes));
      }
    }
    return 0;
  });
}
