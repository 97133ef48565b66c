// easyctx_eval_needle --model DIR --tokenizer FILE --output-dir DIR [--haystack-dir DIR]
//                     [--task needle,passkey,multikey,multivalue,vt] [--device auto|cpu|cuda]
//                     [--min-context-length N] [--max-context-length N] [--context-interval N]
//                     [--depth-interval F] [--samples K] [--distractors K] [--digits D]
//                     [--seed S] [--rope-theta T] [--sp-size N] [--sp-mode MODE]
// EasyContext's needle-in-a-haystack sweep (and RULER-style synthetic retrieval tasks) over
// a model, scored by teacher forcing through an eval::Session: CSV, heatmap PNG, summary
// (docs/eval.md). Under mpirun: sequence parallel over --sp-size ranks, data parallel over
// the prompts of a length's cells across the groups. Logic in lib/eval (needle.h).
#include <algorithm>
#include <iostream>

#include "core/log.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "data/tokenize/tokenizer.h"
#include "eval/haystack.h"
#include "eval/model_source.h"
#include "eval/needle.h"

using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    eval::NeedleOptions o;
    std::string help;
    bool run = false;
    // Bad flags, a missing model, tokenizer or haystack end every rank alike (exit 2).
    dist::run_collectively(rt, [&] {
      run = eval::parse_needle_flags(argc, argv, o, &help);
      if (!run) return;
      eval::validate_session_options(o.session, rt.size());
      eval::resolve_model(o.session.model);
      data::load_tokenizer(o.tokenizer);
      if (std::find(o.tasks.begin(), o.tasks.end(), eval::Task::Needle) != o.tasks.end())
        eval::check_haystack_source(o.haystack_dir);
    });
    if (!run) {
      if (rt.rank() == 0)
        std::cout << help << "\nDocs: docs/eval.md. Exit codes: 0 done, 1 failure, 2 bad input.\n";
      return 0;
    }
    LogOptions lo;
    lo.rank = rt.rank();
    log_init(lo);
    auto world = dist::make_comm(MPI_COMM_WORLD, "world", dist::CommBackend::Mpi, o.session.collective_timeout_s);
    eval::run_needle(o, *world);
    return 0;
  });
}
