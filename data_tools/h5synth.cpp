// h5synth: synthetic retrieval training documents (needle in text, pass key, multi-key,
// multi-value, variable tracking, dense key-value recall, plain text) as an h5tokenize-format
// token shard, every document exactly --length tokens so that the trainer's windows at
// data.seq_length = --length hold one document each. The prompts are eval::PromptBuilder's:
// exactly what easyctx_eval_needle scores. With --prompt-max, every document is a window of
// natural text (--text-dir) with short prompts packed into it. See docs/data.md ("h5synth").
#include <omp.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/shard.h"
#include "data/tokenize/tokenizer.h"
#include "dist/runtime.h"
#include "eval/haystack.h"
#include "eval/synth_docs.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {

int synth_main(int argc, char** argv) {
  eval::SynthOptions o;
  std::string tokenizer, output, haystack_dir, text_dir, mix = "needle=1,passkey=1,kv=1,text=1";
  int64_t documents = 0, haystack_tokens = 4 << 20, text_tokens = 16 << 20;
  int threads = 0;
  po::options_description opts("h5synth --tokenizer MODEL --output DIR --length S --documents N [options]\noptions");
  // clang-format off
  opts.add_options()
      ("help,h", "this help")
      ("tokenizer,t", po::value(&tokenizer)->required(), "SentencePiece .model or Hugging Face tokenizer.json")
      ("output,o", po::value(&output)->required(), "output folder: DIR/synth.h5, DIR/h5synth.json, DIR/tokenizer/")
      ("haystack-dir", po::value(&haystack_dir)->default_value(""),
       "text of the needle haystacks and fillers (as easyctx_eval_needle's flag: .txt, JSON Lines, .h5; "
       "default: the KJV through `bible`)")
      ("haystack-tokens", po::value(&haystack_tokens)->default_value(haystack_tokens),
       "tokens of haystack text to read (repeated from the start when the text is shorter)")
      ("text-dir", po::value(&text_dir)->default_value(""),
       "text of the packed windows (--prompt-max; the same forms as --haystack-dir; default: the haystack)")
      ("text-tokens", po::value(&text_tokens)->default_value(text_tokens),
       "tokens of --text-dir to read at most (all of a smaller text, repeated only up to --length)")
      ("length", po::value(&o.length)->required(), "tokens per document (the stage's data.seq_length)")
      ("documents", po::value(&documents)->required(), "documents to write")
      ("mix", po::value(&mix)->default_value(mix),
       "relative weights of the document kinds: text, needle, passkey, multikey, multivalue, vt, kv, repeat")
      ("prompt-min", po::value(&o.prompt_min)->default_value(o.prompt_min, "0.125"),
       "a prompt's length is drawn in [prompt-min x length, length], the rest is text before it (1: whole documents); "
       "with --prompt-max in [prompt-min x prompt-max, prompt-max]")
      ("prompt-max", po::value(&o.prompt_max)->default_value(0),
       "0: one prompt per document, as above; N >= 64: packed windows: a run of --text-dir text across each "
       "document with whole prompts of at most N tokens put in at random points, --mix weights as token shares")
      ("digits", po::value(&o.task.digits)->default_value(o.task.digits), "digits of every number")
      ("keys", po::value(&o.task.keys)->default_value(o.task.keys), "multikey: keys per prompt")
      ("values", po::value(&o.task.values)->default_value(o.task.values), "multivalue: values per prompt")
      ("hops", po::value(&o.task.hops)->default_value(o.task.hops), "vt: assignments after the first")
      ("kv-pairs", po::value(&o.kv_pairs)->default_value(0), "kv: pairs per document (0: about length / 48)")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed: document i is a function of (seed, i)")
      ("threads", po::value(&threads)->default_value(0), "threads (0: OpenMP's default)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    EASYCTX_THROW_INPUT(e.what(), " (see h5synth --help)");
  }
  o.mix = eval::parse_mix(mix);
  eval::check_synth_options(o);
  EASYCTX_CHECK_INPUT(documents >= 1, "--documents: ", documents, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(haystack_tokens >= 1, "--haystack-tokens: ", haystack_tokens, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(text_tokens >= 1, "--text-tokens: ", text_tokens, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(text_dir.empty() || o.prompt_max > 0, "--text-dir: only packed windows (--prompt-max) read it");
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(tokenizer), "--tokenizer: ", tokenizer, " is not a file");
  eval::check_haystack_source(haystack_dir);
  if (!text_dir.empty()) eval::check_text_source(text_dir);
  if (threads > 0) omp_set_num_threads(threads);

  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = data::load_tokenizer(tokenizer);
  eval::Haystack hay = eval::load_haystack(haystack_dir, *tok, std::max<int64_t>(haystack_tokens, 2 * o.length));
  log_info("h5synth: haystack ", hay.description);
  eval::Haystack text;
  if (!text_dir.empty()) {
    text = eval::load_text(text_dir, *tok, text_tokens, o.length);
    log_info("h5synth: text ", text.description);
  }
  const eval::SynthDocs docs(*tok, o, std::move(hay.tokens), std::move(text.tokens));

  namespace fs = std::filesystem;
  fs::create_directories(output);
  fs::create_directories(fs::path(output) / "tokenizer");
  fs::copy_file(tokenizer,
                fs::path(output) / "tokenizer" / (tok->kind() == "hf-bpe" ? "tokenizer.json" : "tokenizer.model"),
                fs::copy_options::overwrite_existing);
  data::ShardMeta meta;
  meta.tokenizer_name = fs::path(tokenizer).filename().string();
  meta.tokenizer_sha256 = tok->sha256();
  meta.vocab_size = tok->vocab_size();
  meta.bos_id = tok->bos_id();
  meta.eos_id = tok->eos_id();
  meta.add_bos = tok->bos_id() >= 0;
  meta.add_eos = false;
  data::TokenShardWriter w((fs::path(output) / "synth.h5").string(), meta);
  std::map<eval::DocKind, int64_t> counts;
  std::map<eval::DocKind, uint16_t> source;
  // Batches built in parallel, written in order: the shard does not depend on --threads.
  const int64_t batch = 256;
  std::vector<std::vector<uint32_t>> buf(static_cast<size_t>(batch));
  std::vector<eval::DocKind> kinds(static_cast<size_t>(batch));
  std::vector<eval::DocTally> tallies(static_cast<size_t>(batch));
  eval::DocTally tally;
  for (int64_t first = 0; first < documents; first += batch) {
    const int64_t n = std::min(batch, documents - first);
    std::exception_ptr failed;  // an exception may not leave an OpenMP region: rethrown after it
#pragma omp parallel for schedule(dynamic)
    for (int64_t j = 0; j < n; ++j) {
      try {
        tallies[static_cast<size_t>(j)] = eval::DocTally();
        buf[static_cast<size_t>(j)] =
            docs.document(static_cast<uint64_t>(first + j), &kinds[static_cast<size_t>(j)], &tallies[static_cast<size_t>(j)]);
      } catch (...) {
#pragma omp critical
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    for (int64_t j = 0; j < n; ++j) {
      const eval::DocKind k = kinds[static_cast<size_t>(j)];
      tally.add(tallies[static_cast<size_t>(j)]);
      if (!source.count(k)) source[k] = w.source_index(eval::doc_kind_name(k));
      ++counts[k];
      w.add_document(buf[static_cast<size_t>(j)].data(), buf[static_cast<size_t>(j)].size(), source[k]);
    }
  }
  Json settings = Json::object();
  settings.set("length", o.length);
  settings.set("documents", documents);
  settings.set("mix", mix);
  settings.set("prompt_min", o.prompt_min);
  settings.set("digits", o.task.digits);
  settings.set("seed", static_cast<int64_t>(o.seed));
  settings.set("haystack", hay.description);
  if (o.prompt_max > 0) {
    settings.set("prompt_max", o.prompt_max);
    settings.set("text", text_dir.empty() ? std::string("the haystack") : text.description);
  }
  w.set_extra("h5synth", settings.dump());
  w.commit();

  // What an eval prompt of context L costs beyond L, per task: the bench picks its lengths
  // with it so that a prompt fits a training window.
  Json summary = settings;
  Json by_kind = Json::object(), overhead = Json::object();
  for (const auto& kv : counts) by_kind.set(eval::doc_kind_name(kv.first), kv.second);
  // What the windows hold, exactly: tokens and whole prompts by kind, the prompts' lengths.
  Json tokens_by_kind = Json::object(), prompts_by_kind = Json::object();
  for (const auto& kv : tally.tokens) tokens_by_kind.set(eval::doc_kind_name(kv.first), kv.second);
  for (const auto& kv : tally.prompts) prompts_by_kind.set(eval::doc_kind_name(kv.first), kv.second);
  summary.set("tokens_by_kind", tokens_by_kind);
  summary.set("prompts_by_kind", prompts_by_kind);
  summary.set("shortest_prompt", tally.shortest_prompt);
  summary.set("longest_prompt", tally.longest_prompt);
  for (eval::Task t : {eval::Task::Needle, eval::Task::Passkey, eval::Task::MultiKey, eval::Task::MultiValue,
                       eval::Task::VariableTracking})
    overhead.set(eval::task_name(t), docs.overhead(t));
  summary.set("tokens", static_cast<int64_t>(w.num_tokens()));
  summary.set("documents_by_kind", by_kind);
  summary.set("eval_overhead", overhead);
  write_file_atomic((fs::path(output) / "h5synth.json").string(), summary.dump(2) + "\n");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string kinds_line;
  for (const auto& kv : counts) kinds_line += std::string(kinds_line.empty() ? "" : ", ") + eval::doc_kind_name(kv.first) + " " + std::to_string(kv.second);
  if (o.prompt_max > 0) {
    kinds_line = "packed:";
    for (const auto& kv : tally.tokens)
      kinds_line += std::string(" ") + eval::doc_kind_name(kv.first) + " " +
                    format_count(static_cast<double>(kv.second)) + " tokens" +
                    (tally.prompts.count(kv.first) ? " in " + std::to_string(tally.prompts.at(kv.first)) + " prompts" : "") + ",";
    kinds_line += " prompts " + std::to_string(tally.shortest_prompt) + "-" + std::to_string(tally.longest_prompt) + " tokens";
  }
  std::cout << "h5synth: " << documents << " documents of " << o.length << " tokens (" << kinds_line << "), "
            << format_count(static_cast<double>(w.num_tokens())) << " tokens in " << format_duration(s) << " -> " << output << "/synth.h5\n"
            << "h5synth: eval prompt overhead (tokens beyond the context length): needle "
            << docs.overhead(eval::Task::Needle) << ", passkey " << docs.overhead(eval::Task::Passkey) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime&) {
    log_init(LogOptions{0, LogLevel::Info, ""});
    return synth_main(argc, argv);
  });
}
