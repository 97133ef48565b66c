// The run report (easyctx_report RUN_DIR...): one self-contained HTML page for a run or a chain
// of stages (the recipe), from what the trainer and the evaluations leave in each output folder:
//   metrics.jsonl   per step: loss, lr, grad norm, tokens/s, MFU, memory, elapsed
//   plan.json       the memory plan the run was checked against (plan::plan_to_json, written by
//                   Trainer::run; what easyctx_train --plan prints last): its totals, per-GPU and
//                   per-node peaks by category, and the settings that shape it (a CPU run's
//                   plan, target.backend cpu: its host figures only, "n/a (CPU run)" per GPU)
//   run.json        the run's identity and stage settings, when present
//   DONE            the stage finished
//   *.csv           evaluations, in the folder or its eval/ subfolder, recognised by header:
//                   "tokens,ppl,documents,nll" (easyctx_eval_ppl), "context,depth,score,samples"
//                   (easyctx_eval_needle's needle.csv), "task,context,score,samples" (its
//                   synthetic.csv: passkey, multikey, multivalue, vt)
// Stages are placed one after the other on a global step axis, their boundaries marked; a
// restart (the elapsed time going back between two records: a resume after preemption) is
// marked too. No scripts and nothing fetched: inline SVG and CSS. The data shown is also
// embedded as one JSON object (<script type="application/json" id="easyctx-report-data">) for
// tools and tests.
#pragma once
#include <string>
#include <vector>

#include "core/json.h"

namespace easyctx::report {

struct PplCurve {
  std::string name;  // the CSV's file name
  std::vector<double> tokens, ppl;
};

struct NeedleGrid {
  std::string name;
  std::vector<int64_t> contexts;           // columns
  std::vector<double> depths;              // rows
  std::vector<std::vector<double>> score;  // [depth][context], NaN where absent
};

struct SyntheticGrid {
  std::string name;
  std::vector<std::string> tasks;          // rows, in the CSV's order
  std::vector<int64_t> contexts;           // columns
  std::vector<std::vector<double>> score;  // [task][context], NaN where absent
};

struct StageRun {
  std::string dir, name;
  std::vector<Json> metrics;  // metrics.jsonl records in order
  Json plan, run;             // plan.json, run.json (null when absent)
  bool done = false;
  std::vector<size_t> restarts;  // indices of metrics where a resumed run's first record is
  std::vector<PplCurve> ppl;
  std::vector<NeedleGrid> needle;
  std::vector<SyntheticGrid> synthetic;
};

// Reads one output folder (InputError naming the folder when it holds none of the files).
StageRun read_stage(const std::string& dir);

// The page for stages in chain order.
std::string render_report(const std::vector<StageRun>& stages, const std::string& title);

// The data the page shows, as JSON (also embedded in the page).
Json report_data(const std::vector<StageRun>& stages);

}  // namespace easyctx::report
