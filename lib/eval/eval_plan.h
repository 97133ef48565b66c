// --plan for the evaluation programs (easyctx_eval_ppl, easyctx_eval_needle): the memory plan
// of a session (plan::plan_inference) from its options, and its printout with the
// programs' flag names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "eval/session.h"
#include "plan/memory_plan.h"

namespace easyctx::eval {

// The plan of opening a session with `o` and scoring sequences of up to max_tokens tokens,
// for the machine of `sets` ("target.gpu=H200", ...: --set takes target.* keys only), the
// launch (world_size ranks, ranks_per_node of them per node) and this machine. InputError
// naming the flag when the options or the model are wrong.
plan::MemoryPlan plan_session(const SessionOptions& o, int64_t max_tokens, const std::vector<std::string>& sets,
                              int world_size, int ranks_per_node);
// "does not fit: predicted ... Would fit: --attention-head-groups 4 (31.2 GiB per GPU); ..."
// ("" when it fits).
std::string session_refusal(const plan::MemoryPlan& p);
// What --plan prints: the table, the refusal if any, and the plan as JSON on the last line.
std::string format_session_plan(const plan::MemoryPlan& p);

}  // namespace easyctx::eval
