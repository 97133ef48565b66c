// easyctx_train STAGE.yaml [--set key=value ...] [--print-config] [--config-doc] [--plan]
//               [--resume auto|none|PATH]
// Loads and validates the stage config on every rank, builds the process groups, and runs
// the stage (lib/train). --plan prints the memory plan (lib/plan) and exits: 0 when the run
// fits its target, 3 when it does not, 2 on bad input. Everything else lives in lib/.
#include <boost/program_options.hpp>
#include <iostream>

#include "core/config.h"
#include "core/error.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "dist/signals.h"
#include "dist/watchdog.h"
#include "ops/backend_factory.h"
#include "plan/memory_plan.h"
#include "plan/target.h"
#include "train/trainer.h"

namespace po = boost::program_options;
using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    po::options_description opts("easyctx_train STAGE.yaml [options]");
    opts.add_options()("help,h", "show this help")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set key=value (repeatable)")(
        "print-config", "print the resolved config and the process-group layout, then exit")(
        "resume", po::value<std::string>()->default_value("auto"),
        "auto: continue from the newest committed checkpoint in <output.dir>/checkpoints if any; none: start "
        "from model.init; PATH: resume from that checkpoint")(
        "config-doc", "print the Markdown reference of every config key (docs/config.md), then exit")(
        "plan", "print the memory plan (every buffer per GPU and per host; docs/memory-model.md) as a table, then "
        "as one JSON object on the last line, and exit without allocating: 0 when the run fits, 3 when it does "
        "not (the message names the --set changes that would fit), 2 on bad input. Plans for target.* (GPU "
        "model and memory, GPUs per node, nodes, host memory), else the launch and this machine, so it runs on "
        "a login node without GPUs");
    po::options_description hidden;
    hidden.add_options()("stage", po::value<std::string>(), "stage YAML");
    po::options_description all;
    all.add(opts).add(hidden);
    po::positional_options_description pos;
    pos.add("stage", 1);
    po::variables_map vm;
    dist::run_collectively(rt, [&] {
      try {
        po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
        po::notify(vm);
      } catch (const po::error& e) {
        EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)");
      }
    });
    if (vm.count("help")) {
      if (rt.rank() == 0)
        std::cout << opts << "\nConfig keys: docs/config.md (or --config-doc). Memory plan: docs/memory-model.md.\n"
                  << "Exit codes: 0 done (or stopped by a signal after its checkpoint), 1 failure, 2 bad input, "
                     "3 --plan: does not fit.\n";
      return 0;
    }
    if (vm.count("config-doc")) {
      if (rt.rank() == 0) std::cout << config_reference_markdown();
      return 0;
    }
    StageConfig cfg;
    dist::GroupLayout layout;
    plan::MemoryPlan mem_plan;
    const bool plan_only = vm.count("plan") > 0, print_only = vm.count("print-config") > 0;
    plan::LayoutWorld shown;
    dist::run_collectively(rt, [&] {
      EASYCTX_CHECK_INPUT(vm.count("stage"), "command line: missing STAGE.yaml (see --help)");
      std::vector<std::string> sets;
      if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
      cfg = load_stage_config(vm["stage"].as<std::string>(), sets);
      // --plan checks the config against the target's world, not this launch's.
      if (plan_only) {
        mem_plan = plan::plan_memory(cfg, plan::resolve_target(cfg, rt.size(), rt.topology().local_size));
      } else if (print_only) {  // also on one process for any layout (a login node, slurm/common.sh)
        shown = plan::print_config_world(cfg, rt.size(), rt.topology().local_size);
        layout = dist::make_group_layout(cfg, shown.world, shown.ranks_per_node);
      } else {
        layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
      }
    });
    // From here on collectives wait as long as the config says (start-up used the default).
    dist::set_default_collective_timeout_s(cfg.parallel.collective_timeout_s);
    if (plan_only) {
      if (rt.rank() == 0) {
        std::cout << plan::format_plan_table(mem_plan);
        if (!mem_plan.fits) std::cout << "\n" << plan::refusal_message(mem_plan) << "\n";
        std::cout << "\n" << plan::plan_to_json(mem_plan).dump() << std::endl;
      }
      return mem_plan.fits ? 0 : 3;
    }
    if (print_only) {
      if (rt.rank() == 0) {
        std::cout << "# resolved configuration (" << cfg.source << ")\n" << dump_stage_config(cfg) << "\n# layout for "
                  << shown.world << " rank(s): " << shown.note << "\n" << layout.describe();
        // What this build can run (slurm/common.sh refuses a GPU stage on a CPU-only build).
        if (ops::cuda_backend_built())
          std::cout << "# this build: CUDA backend, " << ops::visible_cuda_devices() << " CUDA device(s) visible here\n";
        else
          std::cout << "# this build: CPU only (no CUDA backend: configured without the CUDA toolkit, cuDNN or NCCL)\n";
      }
      return 0;
    }
    // A stop signal from now on is honoured at the first step boundary (dist/signals.h).
    dist::install_stop_signals();
    train::RunOptions run_opts;
    run_opts.resume = vm["resume"].as<std::string>();
    dist::CommBackend backend{};
    dist::run_collectively(rt, [&] { backend = dist::choose_backend(train::trainer_device(cfg.train.device)); });
    dist::ProcessGroups groups(rt, layout, backend, cfg.parallel.collective_timeout_s);
    return train::run_stage(rt, cfg, groups, run_opts);
  });
}
