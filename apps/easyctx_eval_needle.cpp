// easyctx_eval_needle --model DIR [--tokenizer FILE] [--output-dir DIR] [--haystack-dir DIR] [--tensorboard DIR]
//                     [--task needle,passkey,multikey,multivalue,vt] [--device auto|cpu|cuda]
//                     [--min-context-length N] [--max-context-length N] [--context-interval N]
//                     [--depth-interval F] [--samples K] [--distractors K] [--digits D]
//                     [--seed S] [--rope-theta T] [--sp-size N] [--sp-mode MODE]
//                     [--print-sweep] [--plan [--set target.KEY=VALUE ...]]
// EasyContext's eval_needle.py spellings (--num_samples, --haystack_dir, ...) are accepted too
// (docs/easycontext.md).
// EasyContext's needle-in-a-haystack sweep (and RULER-style synthetic retrieval tasks) over
// a model, scored by teacher forcing through an eval::Session: CSV, heatmap PNG, summary
// (docs/eval.md). Under mpirun: sequence parallel over --sp-size ranks, data parallel over
// the prompts of a length's cells across the groups. --plan prints the memory plan of the
// longest prompt and exits (0 fits, 3 does not, 2 bad input). Logic in lib/eval (needle.h).
#include <algorithm>
#include <iostream>
#include <memory>

#include "core/log.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "data/tokenize/tokenizer.h"
#include "eval/eval_plan.h"
#include "eval/haystack.h"
#include "eval/model_source.h"
#include "eval/needle.h"

using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    eval::NeedleOptions o;
    std::string help;
    bool run = false;
    // Bad flags, a missing or corrupt model, a missing tokenizer or haystack end every rank
    // alike (exit 2, one message), in phases every rank enters or none does (run_collectively).
    bool needle = false;
    std::unique_ptr<data::Tokenizer> tok;  // loaded once here, used by the plan and the haystack
    dist::run_collectively(rt, [&] {
      run = eval::parse_needle_flags(argc, argv, o, &help);
      if (!run) return;
      eval::validate_session_options(o.session, rt.size());
      if (o.print_sweep) return;  // prints the options alone: no file is read
      tok = data::load_tokenizer(o.tokenizer);
      needle = std::find(o.tasks.begin(), o.tasks.end(), eval::Task::Needle) != o.tasks.end();
      // Rank 0 alone reads the haystack (below), so rank 0 alone needs to see it.
      if (needle && rt.rank() == 0) eval::check_haystack_source(o.haystack_dir);
    });
    if (!run) {
      if (rt.rank() == 0)
        std::cout << help
                  << "\nDocs: docs/eval.md. Exit codes: 0 done (--plan: fits), 1 failure, 2 bad input, "
                     "3 --plan: does not fit.\n";
      return 0;
    }
    if (o.print_sweep) {
      if (rt.rank() == 0) std::cout << eval::describe_needle_options(o);
      return 0;
    }
    // The model in a phase of its own: a checkpoint is verified collectively (each file by one
    // rank), which every rank must enter. The plan and the session reuse the result instead of
    // verifying again.
    dist::run_collectively(rt, [&] {
      o.session.resolved = std::make_shared<const eval::ModelRef>(
          eval::resolve_model(o.session.model, MPI_COMM_WORLD, o.session.collective_timeout_s));
    });
    if (o.plan) {  // the plan of the longest prompt on the machine of --set (else this one)
      plan::MemoryPlan p;
      dist::run_collectively(rt, [&] {
        const int64_t longest = eval::longest_prompt_tokens(o, *tok);
        p = eval::plan_session(o.session, longest, o.plan_sets, rt.size(), rt.topology().local_size);
        if (rt.rank() == 0)
          std::cout << "longest prompt: " << longest << " tokens (context length " << eval::context_lengths(o).back()
                    << " plus the prompt's fixed part)\n";
      });
      if (rt.rank() == 0) std::cout << eval::format_session_plan(p);
      return p.fits ? 0 : 3;
    }
    LogOptions lo;
    lo.rank = rt.rank();
    log_init(lo);
    auto world = dist::make_comm(MPI_COMM_WORLD, "world", dist::CommBackend::Mpi, o.session.collective_timeout_s);
    // The haystack: rank 0 reads and tokenizes it, every rank gets the ids; a file that cannot
    // be read or tokenized ends every rank alike, before the weights are loaded.
    eval::Haystack hay;
    if (needle)
      dist::run_collectively(rt, [&] { hay = eval::load_haystack(o.haystack_dir, *tok, o.max_context, *world); });
    eval::run_needle(o, *world, needle ? &hay : nullptr);
    return 0;
  });
}
