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
#include "tool_flags.h"
#include "tool_shard.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {

// The command line.
struct SynthCli {
  eval::SynthOptions o;
  std::string tokenizer, output, haystack_dir, text_dir, mix = "needle=1,passkey=1,kv=1,text=1";
  int64_t documents = 0, haystack_tokens = 4 << 20, text_tokens = 16 << 20;
  int threads = 0;
};

void add_synth_flags(po::options_description& opts, SynthCli& c) {
  // clang-format off
  opts.add_options()
      ("help,h", "this help")
      ("tokenizer,t", po::value(&c.tokenizer)->required(), "SentencePiece .model or Hugging Face tokenizer.json")
      ("output,o", po::value(&c.output)->required(), "output folder: DIR/synth.h5, DIR/h5synth.json, DIR/tokenizer/")
      ("haystack-dir", po::value(&c.haystack_dir)->default_value(""),
       "text of the needle haystacks and fillers (as easyctx_eval_needle's flag: .txt, JSON Lines, .h5; "
       "default: the KJV through `bible`)")
      ("haystack-tokens", po::value(&c.haystack_tokens)->default_value(c.haystack_tokens),
       "tokens of haystack text to read (repeated from the start when the text is shorter)")
      ("text-dir", po::value(&c.text_dir)->default_value(""),
       "text of the packed windows (--prompt-max; the same forms as --haystack-dir; default: the haystack)")
      ("text-tokens", po::value(&c.text_tokens)->default_value(c.text_tokens),
       "tokens of --text-dir to read at most (all of a smaller text, repeated only up to --length)")
      ("length", po::value(&c.o.length)->required(), "tokens per document (the stage's data.seq_length)")
      ("documents", po::value(&c.documents)->required(), "documents to write")
      ("mix", po::value(&c.mix)->default_value(c.mix),
       "relative weights of the document kinds: text, needle, passkey, multikey, multivalue, vt, kv, repeat")
      ("prompt-min", po::value(&c.o.prompt_min)->default_value(c.o.prompt_min, "0.125"),
       "a prompt's length is drawn in [prompt-min x length, length], the rest is text before it (1: whole documents); "
       "with --prompt-max in [prompt-min x prompt-max, prompt-max]")
      ("prompt-max", po::value(&c.o.prompt_max)->default_value(0),
       "0: one prompt per document, as above; N >= 64: packed windows: a run of --text-dir text across each "
       "document with whole prompts of at most N tokens put in at random points, --mix weights as token shares")
      ("digits", po::value(&c.o.task.digits)->default_value(c.o.task.digits), "digits of every number")
      ("keys", po::value(&c.o.task.keys)->default_value(c.o.task.keys), "multikey: keys per prompt")
      ("values", po::value(&c.o.task.values)->default_value(c.o.task.values), "multivalue: values per prompt")
      ("hops", po::value(&c.o.task.hops)->default_value(c.o.task.hops), "vt: assignments after the first")
      ("kv-pairs", po::value(&c.o.kv_pairs)->default_value(0), "kv: pairs per document (0: about length / 48)")
      ("seed", po::value(&c.o.seed)->default_value(c.o.seed), "seed: document i is a function of (seed, i)")
      ("threads", po::value(&c.threads)->default_value(0), "threads (0: OpenMP's default)");
  // clang-format on
}

// Parses and checks the command line; false after --help.
bool parse_synth_flags(int argc, char** argv, SynthCli& c) {
  po::options_description opts("h5synth --tokenizer MODEL --output DIR --length S --documents N [options]\noptions");
  add_synth_flags(opts, c);
  po::variables_map vm;
  if (!data_tools::parse_flags(argc, argv, opts, nullptr, true, "h5synth", vm)) return false;
  c.o.mix = eval::parse_mix(c.mix);
  eval::check_synth_options(c.o);
  EASYCTX_CHECK_INPUT(c.documents >= 1, "--documents: ", c.documents, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(c.haystack_tokens >= 1, "--haystack-tokens: ", c.haystack_tokens, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(c.text_tokens >= 1, "--text-tokens: ", c.text_tokens, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(c.text_dir.empty() || c.o.prompt_max > 0,
                      "--text-dir: only packed windows (--prompt-max) read it");
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(c.tokenizer), "--tokenizer: ", c.tokenizer, " is not a file");
  eval::check_haystack_source(c.haystack_dir);
  if (!c.text_dir.empty()) eval::check_text_source(c.text_dir);
  if (c.threads > 0) omp_set_num_threads(c.threads);
  return true;
}

// What was written: documents by kind, and (packed windows) tokens and prompts by kind.
struct Written {
  std::map<eval::DocKind, int64_t> counts;
  eval::DocTally tally;
};

// Writes documents 0..documents-1 to w, built in parallel.
Written write_documents(const eval::SynthDocs& docs, int64_t documents, data::TokenShardWriter& w) {
  Written out;
  std::map<eval::DocKind, int64_t>& counts = out.counts;
  eval::DocTally& tally = out.tally;
  std::map<eval::DocKind, uint16_t> source;
  struct Built {
    std::vector<uint32_t> doc;
    eval::DocKind kind = eval::DocKind::Text;
    eval::DocTally tally;
  };
  data_tools::build_in_order<Built>(
      documents,
      [&](uint64_t i) {
        Built b;
        b.doc = docs.document(i, &b.kind, &b.tally);
        return b;
      },
      [&](const Built& b) {
        tally.add(b.tally);
        if (!source.count(b.kind)) source[b.kind] = w.source_index(eval::doc_kind_name(b.kind));
        ++counts[b.kind];
        w.add_document(b.doc.data(), b.doc.size(), source[b.kind]);
      });
  return out;
}

// h5synth.json: the settings, what the windows hold, and what an eval prompt of context L
// costs beyond L per task (the bench picks its lengths with it so that a prompt fits a
// training window).
Json summary_json(const Json& settings, const Written& wr, const eval::SynthDocs& docs, int64_t tokens) {
  const std::map<eval::DocKind, int64_t>& counts = wr.counts;
  const eval::DocTally& tally = wr.tally;
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
  summary.set("tokens", tokens);
  summary.set("documents_by_kind", by_kind);
  summary.set("eval_overhead", overhead);
  return summary;
}

// The kinds written, for the last line: documents by kind, or (packed) tokens and prompts.
std::string kinds_line(const Written& wr, bool packed) {
  const std::map<eval::DocKind, int64_t>& counts = wr.counts;
  const eval::DocTally& tally = wr.tally;
  std::string line;
  for (const auto& kv : counts)
    line += std::string(line.empty() ? "" : ", ") + eval::doc_kind_name(kv.first) + " " + std::to_string(kv.second);
  if (packed) {
    line = "packed:";
    for (const auto& kv : tally.tokens)
      line += std::string(" ") + eval::doc_kind_name(kv.first) + " " + format_count(static_cast<double>(kv.second)) +
              " tokens" +
              (tally.prompts.count(kv.first) ? " in " + std::to_string(tally.prompts.at(kv.first)) + " prompts" : "") +
              ",";
    line +=
        " prompts " + std::to_string(tally.shortest_prompt) + "-" + std::to_string(tally.longest_prompt) + " tokens";
  }
  return line;
}

int synth_main(int argc, char** argv) {
  SynthCli c;
  if (!parse_synth_flags(argc, argv, c)) return 0;
  const eval::SynthOptions& o = c.o;
  const std::string &tokenizer = c.tokenizer, &output = c.output, &text_dir = c.text_dir, &mix = c.mix;
  const int64_t documents = c.documents;

  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = data::load_tokenizer(tokenizer);
  eval::Haystack hay = eval::load_haystack(c.haystack_dir, *tok, std::max<int64_t>(c.haystack_tokens, 2 * o.length));
  log_info("h5synth: haystack ", hay.description);
  eval::Haystack text;
  if (!text_dir.empty()) {
    text = eval::load_text(text_dir, *tok, c.text_tokens, o.length);
    log_info("h5synth: text ", text.description);
  }
  const eval::SynthDocs docs(*tok, o, std::move(hay.tokens), std::move(text.tokens));

  namespace fs = std::filesystem;
  data::TokenShardWriter w((fs::path(output) / "synth.h5").string(),
                           data_tools::prepare_shard_output(output, tokenizer, *tok));
  const Written wr = write_documents(docs, documents, w);
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
  const Json summary = summary_json(settings, wr, docs, static_cast<int64_t>(w.num_tokens()));
  write_file_atomic((fs::path(output) / "h5synth.json").string(), summary.dump(2) + "\n");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string kinds = kinds_line(wr, o.prompt_max > 0);
  std::cout << "h5synth: " << documents << " documents of " << o.length << " tokens (" << kinds << "), "
            << format_count(static_cast<double>(w.num_tokens())) << " tokens in " << format_duration(s) << " -> "
            << output << "/synth.h5\n"
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
