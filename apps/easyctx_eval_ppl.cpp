// easyctx_eval_ppl --model DIR [--model DIR2 ...] --tokenized FILE... [--min-tokens A]
//                  [--max-tokens B] [--tokens-step S] [--samples K] [--rope-theta T]
//                  [--dataset-min-tokens N] [--truncate | --sliding-window W] [--csv-format F]
//                  [--device auto|cpu|cuda] [--sp-size N --sp-mode MODE] [--attention-head-groups G]
//                  [--output-file CSV] [--plot PNG] [--tensorboard DIR]
//                  [--plan [--set target.KEY=VALUE ...]]
// Perplexity of Hugging Face Llama folders or training checkpoints (ckpt:DIR) over document
// lengths A, A+S, ..., B (without S: A, 2A, 4A, ...) on pre-tokenized shards (docs/eval.md), on
// the CPU or GPUs, sequence parallel inside groups of --sp-size ranks and data parallel over
// documents across the groups (mpirun). Several models run one after another on the same
// documents: a CSV each plus one with a model column, one plot, and TensorBoard events
// (eval_ppl/<model> against the length; by default in <CSV's folder>/tensorboard).
// EasyContext's eval_ppl.py command line runs as written (docs/easycontext.md):
// --dataset-min-tokens, --truncate or --sliding-window select its fixed documents and windows
// and its wide CSV. --plan prints the memory plan of the longest length and exits (0 fits, 3
// does not, 2 bad input). Logic in lib/eval.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "eval/eval_plan.h"
#include "eval/model_source.h"
#include "eval/perplexity.h"
#include "eval/png.h"
#include "plan/target.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {

std::string stem_of(const std::string& path) {
  return ends_with(path, ".csv") ? path.substr(0, path.size() - 4) : path;
}

std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return o;
}

// The command line, as parsed.
struct Cli {
  eval::PplOptions o;
  std::vector<std::string> models, sets;
  std::string out, plot, tensorboard, device = "auto", sp_mode = "zigzag_ring", csv_format = "auto";
  std::string hf_dataset, hf_subset, hf_feature, hf_split, save_tokenized, adapter;
  double progress_every = 30;
  po::variables_map vm;
};

// The flags of the documents and lengths (EasyContext's among them).
void add_document_flags(po::options_description& opts, Cli& c) {
  opts.add_options()("help,h", "show this help")(
      "model,m", po::value(&c.models)->multitoken()->composing()->required(),
      "model(s): a Hugging Face folder (config.json + safetensors), hf:DIR, or ckpt:DIR (a training checkpoint: "
      "step folder, checkpoints folder or run output.dir; any ZeRO stage or rank count), or a training run's "
      "output.dir (its final/ export), or a PEFT LoRA adapter folder (its base with it merged); MODEL+adapter:DIR "
      "merges an adapter into MODEL. Several (repeat the flag "
      "or list them) run one after another on the same documents")(
      "adapter", po::value(&c.adapter)->default_value(""),
      "a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors, e.g. a LoRA run's final/) "
      "merged into every --model as it loads (W + lora_alpha / r x B A)")(
      "tokenized", po::value(&c.o.tokenized)->multitoken()->required(),
      "h5tokenize shards: files, folders or globs (EasyContext: a datasets folder or hub id; tokenize it with "
      "h5tokenize, docs/data.md)")("min-tokens", po::value(&c.o.min_tokens)->default_value(256),
                                   "first length L (EasyContext's default)")(
      "max-tokens", po::value(&c.o.max_tokens)->default_value(8192), "last length L (EasyContext's default)")(
      "tokens-step", po::value(&c.o.tokens_step)->default_value(0),
      "step between lengths (0, not given: min, 2 min, 4 min, ... <= max, as EasyContext)")(
      "samples", po::value(&c.o.samples)->default_value(-1),
      "number of documents (-1: all). EasyContext's set (with --dataset-min-tokens, --truncate or "
      "--sliding-window): the first K documents with at least --dataset-min-tokens tokens, the same at every "
      "length, as EasyContext. Otherwise per length the first K documents that have L tokens")(
      "dataset-min-tokens", po::value(&c.o.dataset_min_tokens)->default_value(-1),
      "EasyContext's: keep only documents of at least N tokens (a fixed set for every length; selects "
      "EasyContext's documents and windows)")(
      "truncate", po::bool_switch(&c.o.truncate),
      "EasyContext's: one window per document, BOS + its first L - 1 tokens (all of them when shorter; selects "
      "EasyContext's documents)")(
      "sliding-window", po::value(&c.o.sliding_window)->default_value(0),
      "EasyContext's stride without --truncate: windows of up to L - 1 tokens every W tokens, each scoring the "
      "tokens the previous did not (selects EasyContext's documents; with --dataset-min-tokens alone W = 256, "
      "EasyContext's default)")(
      "aggressive-memory",
      "EasyContext's gc.collect() and torch.cuda.empty_cache() after every window: "
      "accepted so that its command runs, with no effect here (what a run needs is planned before it starts: "
      "--plan)")("hide-progress", "no progress lines (EasyContext: no tqdm bars)")(
      "csv-format", po::value(&c.csv_format)->default_value("auto"),
      "auto | long | wide. long: tokens,ppl,documents,nll rows (with several models a model column first, and "
      "a CSV per model); wide: EasyContext's \",L1,L2,...\" header and a row per model that its plot.py and "
      "YaRN's read. auto: wide with EasyContext's documents (--dataset-min-tokens, --truncate, "
      "--sliding-window), long otherwise")("dataset,d", po::value(&c.hf_dataset),
                                           "EasyContext's Hugging Face dataset: not read here (an error); "
                                           "tokenize with h5tokenize and pass --tokenized")(
      "subset,s", po::value(&c.hf_subset), "EasyContext's dataset subset: not read here (an error), as --dataset")(
      "feature,f", po::value(&c.hf_feature), "EasyContext's text column: not read here (an error), as --dataset")(
      "split", po::value(&c.hf_split), "EasyContext's dataset split: not read here (an error), as --dataset")(
      "save-tokenized", po::value(&c.save_tokenized),
      "EasyContext's tokenize-and-save: not done here (an error); h5tokenize writes the shards");
}

// The flags of the run: model overrides, device and parallelism, outputs, --plan.
void add_run_flags(po::options_description& opts, Cli& c) {
  opts.add_options()("rope-theta", po::value(&c.o.rope_theta)->default_value(0),
                     "override the model's rope_theta (0: keep)")(
      "device", po::value(&c.device)->default_value("auto"), "auto | cpu | cuda (auto: a GPU when one is visible)")(
      "sp-size", po::value(&c.o.sp_size)->default_value(1),
      "ranks per sequence (sequence parallelism); the job's ranks are data-parallel groups x sp-size")(
      "sp-mode", po::value(&c.sp_mode)->default_value("zigzag_ring"),
      "zigzag_ring | ulysses | dist_flash | usp (EasyContext's zigzag_ring_attn, ulysses_attn, dist_flash_attn, "
      "usp_attn too)")("ulysses-size", po::value(&c.o.ulysses_size)->default_value(0),
                       "usp: the Ulysses degree inside a sequence-parallel group (0: the ranks per node)")(
      "attention-head-groups", po::value(&c.o.attention_head_groups)->default_value(1),
      "attention in this many passes over head groups (divides the key/value heads): less attention memory")(
      "lm-head-tile", po::value(&c.o.lm_head_tile)->default_value(4096), "tokens per LM-head tile")(
      "mlp-tile", po::value(&c.o.mlp_tile)->default_value(16384),
      "tokens per MLP tile (0: untiled); bounds the MLP activations of long sequences")(
      "output-file", po::value(&c.out)->default_value(""),
      "CSV to write (--csv-format; not given: none, the results are logged, as EasyContext)")(
      "plot", po::value(&c.plot)->default_value(""),
      "PNG of perplexity against context length, every model on one chart (default: <stem>.png with "
      "--output-file; none: no plot)")(
      "print-sweep",
      "print the lengths, the documents chosen, the windows and the CSV format, then exit "
      "without loading any weights (what a command of EasyContext's would do here)")(
      "tensorboard", po::value(&c.tensorboard)->default_value(""),
      "folder of the TensorBoard event file: eval_ppl/<model> = perplexity with step = the length in tokens "
      "(default: <folder of --output-file>/tensorboard, none without --output-file; none: no event file)")(
      "plan",
      "print the memory plan of the longest length per model (every buffer per GPU and per host) as a "
      "table, then as one JSON object on the last line, and exit: 0 when it fits, 3 when it does not (the message "
      "names the flags that would fit), 2 on bad input")(
      "set", po::value(&c.sets)->composing(),
      "--plan's target: --set target.gpu=H200, target.gpu_memory_gib=..., "
      "target.gpus_per_node=..., target.nodes=... (repeatable)")(
      "progress-every", po::value(&c.progress_every)->default_value(30), "seconds between progress lines")(
      "collective-timeout-s", po::value(&c.o.collective_timeout_s)->default_value(3600),
      "with mpirun: a rank that waits this long for the others (longer than one document's forward at "
      "--max-tokens) ends the job, naming the rank that never arrived");
}

// Parses and checks the command line (collectively: bad flags end every rank alike).
void parse_flags(dist::Runtime& rt, int argc, char** argv, const po::options_description& opts, Cli& c) {
  dist::run_collectively(rt, [&] {
    try {
      po::store(po::parse_command_line(argc, argv, opts), c.vm);
      if (c.vm.count("help")) return;
      po::notify(c.vm);
    } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
    c.o.device = eval::parse_device(c.device);
    c.o.sp_mode = eval::parse_sp_mode(c.sp_mode);
    for (std::string& m : c.models) m = eval::with_adapter(m, c.adapter);
    // EasyContext reads Hugging Face datasets itself; here the documents come as shards.
    for (const char* f : {"dataset", "subset", "feature", "split", "save-tokenized"})
      EASYCTX_CHECK_INPUT(!c.vm.count(f), "--", f,
                          ": Hugging Face datasets are not read here; tokenize the "
                          "documents with h5tokenize (docs/data.md) and pass the shards to --tokenized");
    EASYCTX_CHECK_INPUT(c.csv_format == "auto" || c.csv_format == "long" || c.csv_format == "wide",
                        "--csv-format: bad value '", c.csv_format, "': expected auto, long or wide");
    if (c.csv_format == "auto") c.csv_format = eval::easycontext_documents(c.o) ? "wide" : "long";
    EASYCTX_CHECK_INPUT(!c.out.empty() || c.plot.empty() || c.plot == "none",
                        "--plot: needs --output-file (the CSV it plots is written first)");
  });
}

// Every model resolved (a checkpoint verified collectively, each file by one rank, once; the
// plans and the sessions reuse the result), and with --plan the plan of the longest length.
void resolve_models(dist::Runtime& rt, Cli& c, bool plan_only, std::vector<plan::MemoryPlan>& plans) {
  eval::PplOptions& o = c.o;
  dist::run_collectively(rt, [&] {  // bad flags end every rank alike
    EASYCTX_CHECK_INPUT(plan_only || c.sets.empty(), "--set: only with --plan (it names the machine planned for)");
    for (const std::string& m : c.models) eval::validate_session_options(eval::session_options(o, m), rt.size());
  });
  // Missing or corrupt models too, in a phase every rank enters.
  dist::run_collectively(rt, [&] {
    for (const std::string& m : c.models)
      o.resolved[m] =
          std::make_shared<const eval::ModelRef>(eval::resolve_model(m, MPI_COMM_WORLD, o.collective_timeout_s));
    if (!plan_only) return;
    for (size_t m = 0; m < c.models.size(); ++m)
      plans[m] = eval::plan_session(eval::session_options(o, c.models[m]), o.max_tokens, c.sets, rt.size(),
                                    rt.topology().local_size);
  });
}

// --plan: every model's plan; 0 when all fit, else 3.
int print_plans(dist::Runtime& rt, const Cli& c, const std::vector<plan::MemoryPlan>& plans) {
  bool fits = true;
  for (size_t m = 0; m < c.models.size(); ++m) {
    if (rt.rank() == 0) std::cout << "model " << c.models[m] << ":\n" << eval::format_session_plan(plans[m]);
    fits = fits && plans[m].fits;
  }
  return fits ? 0 : 3;
}

// The plan of each model on this machine, for the comparison with what the run measures.
void plan_runs(dist::Runtime& rt, const Cli& c, std::vector<plan::MemoryPlan>& plans) {
  for (size_t m = 0; m < c.models.size(); ++m) {
    try {
      plans[m] = eval::plan_session(eval::session_options(c.o, c.models[m]), c.o.max_tokens, {}, rt.size(),
                                    rt.topology().local_size);
    } catch (const Error& e) { log_warn("memory plan of ", c.models[m], " unavailable: ", e.what()); }
  }
}

// Rank 0: the CSV(s), the plot and the TensorBoard events.
void write_outputs(const Cli& c, const std::vector<eval::PplResult>& results) {
  const std::string& out = c.out;
  const std::string stem = stem_of(out);
  if (out.empty()) {
    // EasyContext without --output-file: the lines below are the results.
  } else if (c.csv_format == "wide") {
    write_file_atomic(out, eval::ppl_csv_wide(results));
  } else if (results.size() == 1) {
    write_file_atomic(out, eval::ppl_csv(results[0].rows));
  } else {
    write_file_atomic(out, eval::ppl_csv(results));
    for (const eval::PplResult& r : results) {
      const std::string f = stem + "." + file_safe(r.label) + ".csv";
      write_file_atomic(f, eval::ppl_csv(r.rows));
      log_info("wrote ", f);
    }
  }
  if (!out.empty()) log_info("wrote ", out);
  if (!out.empty() && c.plot != "none") {
    const std::string png = c.plot.empty() ? stem + ".png" : c.plot;
    eval::write_png(png, eval::render_line_chart(eval::ppl_chart(results)));
    log_info("wrote ", png);
  }
  if (c.tensorboard != "none" && !(c.tensorboard.empty() && out.empty())) {  // no --output-file: no files at all
    const std::string dir =
        c.tensorboard.empty() ? (std::filesystem::path(out).parent_path() / "tensorboard").string() : c.tensorboard;
    log_info("TensorBoard events: ", eval::write_ppl_events(dir, results));
  }
}

// The results as log lines, with each model's plan against what it measured.
void log_results(const std::vector<eval::PplResult>& results, const std::vector<plan::MemoryPlan>& plans) {
  for (size_t m = 0; m < results.size(); ++m) {
    const eval::PplResult& r = results[m];
    for (const eval::PplRow& row : r.rows)
      log_info(r.label, ": tokens ", row.tokens, ": ppl ", row.ppl, " over ", row.documents, " document(s)");
    const eval::SessionStats& s = r.stats;
    log_info("eval ppl summary: ", r.label, ": ", s.items, " document(s), ",
             format_count(static_cast<double>(s.tokens)), " tokens in ", format_duration(s.seconds), " (",
             format_count(s.seconds > 0 ? s.tokens / s.seconds : 0), " tok/s) on ", r.describe);
    if (plans[m].parameters > 0)
      log_info(r.label, ": ",
               plan::compare_line(plans[m], {0, s.alloc_peak_bytes, 0}, static_cast<double>(plan::vm_hwm_bytes()),
                                  s.device_used_bytes));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    Cli c;
    po::options_description opts("easyctx_eval_ppl [options]");
    add_document_flags(opts, c);
    add_run_flags(opts, c);
    parse_flags(rt, argc, argv, opts, c);
    if (c.vm.count("help")) {
      if (rt.rank() == 0)
        std::cout << opts
                  << "\nDocs: docs/eval.md. Exit codes: 0 done (--plan: fits), 1 failure, 2 bad input, "
                     "3 --plan: does not fit.\n";
      return 0;
    }
    LogOptions lo;
    lo.rank = rt.rank();
    log_init(lo);
    // The plan of the longest length, per model (--plan prints it; a run compares with it).
    std::vector<plan::MemoryPlan> plans(c.models.size());
    const bool plan_only = c.vm.count("plan") > 0;
    resolve_models(rt, c, plan_only, plans);
    if (c.vm.count("print-sweep")) {
      std::string text;
      dist::run_collectively(rt, [&] { text = eval::describe_ppl_sweep(c.o, c.models, nullptr); });
      if (rt.rank() == 0)
        std::cout << text << "csv-format: " << c.csv_format << "\noutput-file: " << (c.out.empty() ? "(none)" : c.out)
                  << "\n";
      return 0;
    }
    if (plan_only) return print_plans(rt, c, plans);
    plan_runs(rt, c, plans);
    if (!c.vm.count("hide-progress")) c.o.progress = eval::log_progress("eval ppl", rt.rank(), c.progress_every);
    auto comm = dist::make_comm(MPI_COMM_WORLD, "world", dist::CommBackend::Mpi, c.o.collective_timeout_s);
    c.o.require_every_length = true;  // a length no document reaches is an error, never a nan row
    const std::vector<eval::PplResult> results = eval::evaluate_perplexity_models(c.o, c.models, comm.get());
    if (rt.rank() != 0) return 0;
    write_outputs(c, results);
    log_results(results, plans);
    return 0;
  });
}
