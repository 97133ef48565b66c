// easyctx_train STAGE.yaml [--set key=value ...] [--print-config] [--config-doc] [--resume auto|none|PATH]
// Loads and validates the stage config on every rank, builds the process groups, and runs
// the stage (lib/train). Everything else lives in lib/.
#include <boost/program_options.hpp>
#include <iostream>

#include "core/config.h"
#include "core/error.h"
#include "dist/groups.h"
#include "dist/runtime.h"
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
        "config-doc", "print the Markdown reference of every config key (docs/config.md), then exit");
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
      if (rt.rank() == 0) std::cout << opts << "\nConfig keys: docs/config.md (or --config-doc)\n";
      return 0;
    }
    if (vm.count("config-doc")) {
      if (rt.rank() == 0) std::cout << config_reference_markdown();
      return 0;
    }
    StageConfig cfg;
    dist::GroupLayout layout;
    dist::run_collectively(rt, [&] {
      EASYCTX_CHECK_INPUT(vm.count("stage"), "command line: missing STAGE.yaml (see --help)");
      std::vector<std::string> sets;
      if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
      cfg = load_stage_config(vm["stage"].as<std::string>(), sets);
      layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
    });
    if (vm.count("print-config")) {
      if (rt.rank() == 0) std::cout << "# resolved configuration (" << cfg.source << ")\n" << dump_stage_config(cfg)
                                    << "\n" << layout.describe();
      return 0;
    }
    train::RunOptions run_opts;
    run_opts.resume = vm["resume"].as<std::string>();
    dist::CommBackend backend{};
    dist::run_collectively(rt, [&] { backend = dist::choose_backend(train::trainer_device(cfg.train.device)); });
    dist::ProcessGroups groups(rt, layout, backend, cfg.parallel.collective_timeout_s);
    return train::run_stage(rt, cfg, groups, run_opts);
  });
}
