// easyctx_train STAGE.yaml [--set key=value ...] [--print-config] [--config-doc] [--plan|--plan-json]
//               [--resume auto|none|PATH]
// easyctx_train [STAGE.yaml] EasyContext's train.py flags (--batch-size, --seq-length,
//               --parallel_mode, --wandb, ...) [--set key=value ...] [...]
// Loads and validates the stage config on every rank, builds the process groups, and runs
// the stage (lib/train). EasyContext's train.py flags map onto config keys (over the YAML's,
// under --set; without a YAML over EasyContext's defaults; docs/easycontext.md). --plan
// prints the memory plan (lib/plan; --plan-json also as JSON) and exits: 0 when the run fits its
// target, 3 when it does not, 2 on bad input. Everything else lives in lib/.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "core/cli_alias.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
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

namespace {

// A YAML scalar that --set reads back as this exact string.
std::string yaml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// EasyContext's train.py flags: each one's config key, in the order they are applied.
struct EasyContextFlag {
  const char* flag;
  const char* key;  // "" where the value needs more than a copy (model, mode, wandb)
};
constexpr EasyContextFlag kEasyContextFlags[] = {{"batch-size", "train.batch_size"},
                                                 {"gradient-accumulate-every", "train.grad_accum"},
                                                 {"output-dir", "output.dir"},
                                                 {"seed", "train.seed"},
                                                 {"max-train-steps", "train.steps"},
                                                 {"learning-rate", "train.lr"},
                                                 {"rope-theta", "model.rope_theta"},
                                                 {"dataset", "data.path"},
                                                 {"seq-length", "data.seq_length"},
                                                 {"warmup-steps", "train.warmup_steps"},
                                                 {"lr-schedule", "train.schedule"},
                                                 {"ring_degree", "parallel.sequence.ring_degree"},
                                                 {"model", ""},
                                                 {"parallel_mode", ""},
                                                 {"wandb", ""}};

// Without a stage YAML, the keys EasyContext's train.py and its DeepSpeed config
// (accelerate_configs/zero3_offload.json) fix when a flag is absent.
const std::vector<std::string> kEasyContextDefaults = {
    "train.batch_size=1",     "train.grad_accum=8",      "train.seed=42",         "train.steps=400",
    "train.lr=2e-5",          "model.rope_theta=100000", "data.seq_length=16384", "train.schedule=constant",
    "train.warmup_steps=0",   "train.beta1=0.9",         "train.beta2=0.95",      "train.eps=1e-8",
    "train.weight_decay=0.1", "train.grad_clip=1.0",     "parallel.zero.stage=3"};

// model.init of EasyContext's --model: a Hugging Face folder, or the output of an earlier
// stage (a run's output.dir: its final/ export, what EasyContext's next stage loads).
std::string model_init_of(const std::string& m) {
  namespace fs = std::filesystem;
  if (starts_with(m, "hf:") || starts_with(m, "ckpt:")) return m;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(m) / "config.json", ec)) return "hf:" + m;
  if (fs::is_regular_file(fs::path(m) / "final" / "config.json", ec)) return "hf:" + (fs::path(m) / "final").string();
  EASYCTX_THROW_INPUT("--model: ", m,
                      " is not a Hugging Face folder (config.json + safetensors) or a run's "
                      "output.dir with final/ (EasyContext downloads hub ids; here download it first, e.g. "
                      "huggingface-cli download ",
                      m, " --local-dir DIR, and pass --model DIR)");
}

// The --set overrides EasyContext's flags stand for (before the user's --set).
std::vector<std::string> easycontext_overrides(const po::variables_map& vm, bool have_yaml, int world_size) {
  std::vector<std::string> o;
  if (!have_yaml) {
    o = kEasyContextDefaults;
    for (const char* f : {"output-dir", "model", "dataset", "parallel_mode"})
      EASYCTX_CHECK_INPUT(vm.count(f), "--", f,
                          ": required without STAGE.yaml (EasyContext's train.py command "
                          "line; docs/easycontext.md)");
  }
  // Each flag's value is checked on its own first, so that a bad one is reported under the
  // flag the user typed rather than the --set it becomes.
  auto check = [](const std::string& flag, const std::string& value, const std::string& set) {
    try {
      parse_stage_config("", "", {set});
    } catch (const InputError& e) {
      std::string m = e.what();
      const std::string inner = "--set " + set + ": ";
      if (starts_with(m, inner)) m = m.substr(inner.size());
      EASYCTX_THROW_INPUT("--", flag, " ", value, ": ", m);
    }
  };
  for (const EasyContextFlag& f : kEasyContextFlags) {
    if (!vm.count(f.flag) || !*f.key) continue;
    const std::string v = vm[f.flag].as<std::string>();
    const std::string key = f.key;
    const bool text = key == "output.dir" || key == "data.path";
    const std::string set = key + "=" + (text ? yaml_string(v) : v);
    if (key == "parallel.sequence.ring_degree") {
      // Checked with the mode and the size, which may come later; here only its form.
      const bool ok =
          !v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19 && std::stoll(v) >= 1;
      EASYCTX_CHECK_INPUT(ok, "--ring_degree ", v, ": expected an integer >= 1");
    } else {
      check(f.flag, v, set);
    }
    o.push_back(set);
  }
  if (vm.count("model")) o.push_back("model.init=" + yaml_string(model_init_of(vm["model"].as<std::string>())));
  if (vm.count("parallel_mode")) {
    const std::string mode = vm["parallel_mode"].as<std::string>();
    check("parallel_mode", mode, "parallel.sequence.mode=" + mode);
    o.push_back("parallel.sequence.mode=" + mode);  // EasyContext's names are the config's aliases
    // EasyContext's sequence-parallel group is the whole world; data_parallel has none.
    o.push_back("parallel.sequence.size=" + std::to_string(canonical_sp_mode_name(mode) == "none" ? 1 : world_size));
  }
  if (vm.count("wandb")) o.push_back("logging.tensorboard=true");
  return o;
}

// The program's own flags.
void add_flags(po::options_description& opts) {
  opts.add_options()("help,h", "show this help")("set", po::value<std::vector<std::string>>()->composing(),
                                                 "override a config key: --set key=value (repeatable)")(
      "print-config", "print the resolved config and the process-group layout, then exit")(
      "resume", po::value<std::string>()->default_value("auto"),
      "auto: continue from the newest committed checkpoint in <output.dir>/checkpoints if any; none: start "
      "from model.init; PATH: resume from that checkpoint")(
      "config-doc", "print the Markdown reference of every config key (docs/config.md), then exit")(
      "plan",
      "print the memory plan (every buffer per GPU and per host; docs/memory-model.md) as a table and exit "
      "without allocating: 0 when the run fits, 3 when it does not (the message names the --set changes that "
      "would fit), 2 on bad input. Plans for target.* (GPU model and memory, GPUs per node, nodes, host "
      "memory), else the launch and this machine, so it runs on a login node without GPUs")(
      "plan-json", "--plan, with the whole plan as one JSON object on the last line (for scripts)");
}

// EasyContext's train.py flags (kEasyContextFlags, and the refused ones).
void add_easycontext_flags(po::options_description& ec) {
  ec.add_options()("batch-size", po::value<std::string>(), "train.batch_size (EasyContext default 1)")(
      "gradient-accumulate-every", po::value<std::string>(), "train.grad_accum (default 8)")(
      "output-dir", po::value<std::string>(), "output.dir (required without STAGE.yaml)")(
      "seed", po::value<std::string>(), "train.seed (default 42)")("max-train-steps", po::value<std::string>(),
                                                                   "train.steps (default 400)")(
      "learning-rate", po::value<std::string>(), "train.lr (default 2e-5)")("rope-theta", po::value<std::string>(),
                                                                            "model.rope_theta (default 100000)")(
      "model", po::value<std::string>(),
      "model.init hf:DIR (a Hugging Face folder; an earlier stage's output.dir: its final/)")(
      "dataset", po::value<std::string>(), "data.path (h5tokenize shards; required without STAGE.yaml)")(
      "seq-length", po::value<std::string>(), "data.seq_length (default 16384)")(
      "parallel_mode", po::value<std::string>(),
      "parallel.sequence.mode (zigzag_ring_attn, dist_flash_attn, ulysses_attn, usp_attn, data_parallel or "
      "easyctx's names) and parallel.sequence.size = the launch's ranks (1 for data_parallel), as "
      "EasyContext's group is the whole world; required without STAGE.yaml")(
      "ring_degree", po::value<std::string>(),
      "parallel.sequence.ring_degree (usp: ulysses_size = size / ring_degree)")(
      "wandb", po::value<std::string>(),
      "logging.tensorboard: true (event files under <output.dir>/tensorboard; prints the `wandb sync "
      "--sync-tensorboard` command that uploads them to this project)")(
      "warmup-steps", po::value<std::string>(), "train.warmup_steps (EasyContext before 2024-04-26)")(
      "lr-schedule", po::value<std::string>(), "train.schedule (EasyContext before 2024-04-26: linear or constant)")(
      "lora", "EasyContext before 2024-04-26: refused (full fine-tuning only)")(
      "ring_attention", "EasyContext's first train.py: refused (use --parallel_mode zigzag_ring_attn)");
}

// Parses the command line (collectively: bad flags end every rank alike). Returns whether
// EasyContext's train.py flags were given.
bool parse_flags(dist::Runtime& rt, int argc, char** argv, const po::options_description& opts, po::variables_map& vm) {
  po::options_description hidden;
  hidden.add_options()("stage", po::value<std::string>(), "stage YAML");
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("stage", 1);
  bool easycontext = false;
  dist::run_collectively(rt, [&] {
    try {
      po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
      po::notify(vm);
    } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
    EASYCTX_CHECK_INPUT(!vm.count("lora"),
                        "--lora: not supported (easyctx trains every weight, as EasyContext's "
                        "train.py does since 2024-04-26)");
    EASYCTX_CHECK_INPUT(!vm.count("ring_attention"),
                        "--ring_attention: EasyContext's first train.py flag; use "
                        "--parallel_mode zigzag_ring_attn");
    for (const EasyContextFlag& f : kEasyContextFlags) easycontext = easycontext || vm.count(f.flag) > 0;
  });
  return easycontext;
}

// The stage config and what it runs on, on every rank.
struct Resolved {
  StageConfig cfg;
  dist::GroupLayout layout;
  plan::MemoryPlan mem_plan;  // --plan
  plan::LayoutWorld shown;    // --print-config
};

// Loads the stage config (STAGE.yaml and/or EasyContext's flags, then --set) and makes the
// process-group layout, or with --plan the memory plan of the target's world.
Resolved load_config(dist::Runtime& rt, const po::variables_map& vm, bool easycontext, bool plan_only,
                     bool print_only) {
  Resolved r;
  dist::run_collectively(rt, [&] {
    EASYCTX_CHECK_INPUT(vm.count("stage") || easycontext,
                        "command line: missing STAGE.yaml (or EasyContext's train.py flags; see --help)");
    std::vector<std::string> sets;
    if (easycontext) sets = easycontext_overrides(vm, vm.count("stage") > 0, rt.size());
    if (vm.count("set"))
      for (const std::string& s : vm["set"].as<std::vector<std::string>>()) sets.push_back(s);
    r.cfg = vm.count("stage") ? load_stage_config(vm["stage"].as<std::string>(), sets)
                              : parse_stage_config("", "EasyContext command line", sets);
    // --plan checks the config against the target's world, not this launch's.
    if (plan_only) {
      r.mem_plan = plan::plan_memory(r.cfg, plan::resolve_target(r.cfg, rt.size(), rt.topology().local_size));
    } else if (print_only) {  // also on one process for any layout (a login node, slurm/common.sh)
      r.shown = plan::print_config_world(r.cfg, rt.size(), rt.topology().local_size);
      r.layout = dist::make_group_layout(r.cfg, r.shown.world, r.shown.ranks_per_node);
    } else {
      r.layout = dist::make_group_layout(r.cfg, rt.size(), rt.topology().local_size);
    }
  });
  return r;
}

// --wandb PROJECT: what it turned on, as the config now says (a --set after it may have turned
// logging.tensorboard off again: then there is nothing to upload, and saying so is the point).
void print_wandb(const std::string& project, const StageConfig& cfg) {
  if (!cfg.logging.tensorboard) {
    std::cout << "--wandb " << project
              << ": logging.tensorboard is off (a --set turned it off after --wandb turned it on), so this run "
                 "writes no TensorBoard events to upload; drop that --set to track it"
              << std::endl;
    return;
  }
  std::cout << "--wandb " << project << ": logging.tensorboard is on; upload the run with: "
            << "wandb sync --sync-tensorboard --project " << project << " " << cfg.output.dir << "/tensorboard"
            << std::endl;
}

// --plan: the plan as a table, the refusal when it does not fit, then (--plan-json) as JSON; 0
// fits, else 3. (The JSON, ~10-20 KB on one line, is for scripts, not the terminal.)
int print_plan(dist::Runtime& rt, const plan::MemoryPlan& mem_plan, bool json) {
  if (rt.rank() == 0) {
    std::cout << plan::format_plan_table(mem_plan);
    if (!mem_plan.fits) std::cout << "\n" << plan::refusal_message(mem_plan) << "\n";
    if (json) std::cout << "\n" << plan::plan_to_json(mem_plan).dump() << std::endl;
    else std::cout << "(the whole plan as JSON: --plan-json)" << std::endl;
  }
  return mem_plan.fits ? 0 : 3;
}

// --print-config: the resolved config, the layout and what this build can run.
int print_config(dist::Runtime& rt, const Resolved& r) {
  if (rt.rank() == 0) {
    std::cout << "# resolved configuration (" << r.cfg.source << ")\n"
              << dump_stage_config(r.cfg) << "\n# layout for " << r.shown.world << " rank(s): " << r.shown.note << "\n"
              << r.layout.describe();
    // What this build can run (slurm/common.sh refuses a GPU stage on a CPU-only build).
    if (ops::cuda_backend_built())
      std::cout << "# this build: CUDA backend, " << ops::visible_cuda_devices() << " CUDA device(s) visible here\n";
    else std::cout << "# this build: CPU only (no CUDA backend: configured without the CUDA toolkit, cuDNN or NCCL)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The stop handlers first, before MPI_Init: a launcher's SIGUSR1 or SIGTERM at any
  // moment of the start-up is a stop request honoured at the first step boundary, never the
  // signal's default action (rc 138 for SIGUSR1). --plan and --print-config end on their own.
  dist::install_stop_signals();
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    po::options_description opts("easyctx_train STAGE.yaml [options]");
    add_flags(opts);
    po::options_description ec(
        "EasyContext's train.py flags (docs/easycontext.md); each sets a config key, "
        "over STAGE.yaml's and under --set");
    add_easycontext_flags(ec);
    opts.add(ec);
    po::variables_map vm;
    const bool easycontext = parse_flags(rt, argc, argv, opts, vm);
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
    const bool plan_json = vm.count("plan-json") > 0;
    const bool plan_only = vm.count("plan") > 0 || plan_json, print_only = vm.count("print-config") > 0;
    const Resolved r = load_config(rt, vm, easycontext, plan_only, print_only);
    const StageConfig& cfg = r.cfg;
    if (vm.count("wandb") && rt.rank() == 0) print_wandb(vm["wandb"].as<std::string>(), cfg);
    // From here on collectives wait as long as the config says (start-up used the default).
    dist::set_default_collective_timeout_s(cfg.parallel.collective_timeout_s);
    if (plan_only) return print_plan(rt, r.mem_plan, plan_json);
    if (print_only) return print_config(rt, r);
    train::RunOptions run_opts;
    run_opts.resume = vm["resume"].as<std::string>();
    dist::CommBackend backend{};
    dist::run_collectively(rt, [&] { backend = dist::choose_backend(train::trainer_device(cfg.train.device)); });
    dist::ProcessGroups groups(rt, r.layout, backend, cfg.parallel.collective_timeout_s);
    return train::run_stage(rt, cfg, groups, run_opts);
  });
}
