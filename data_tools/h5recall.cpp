// h5recall: retrieval training windows for the context-extension experiment (docs/data.md
// "h5recall", lib/eval/recall_docs.h): natural text (--text-dir) with episodes of a small
// retrieval grammar put in, every window exactly --length tokens, loss weights on the answers
// (and on the text in --lm-share of the windows), as one h5tokenize-format shard of format
// version 2. Never the needle evaluation's wording: every piece the grammar builds is checked.
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
#include "eval/recall_docs.h"
#include "eval/retrieval.h"
#include "tool_flags.h"
#include "tool_shard.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {

struct RecallCli {
  eval::RecallOptions o;
  std::string tokenizer, output, text, mix = "fact=4,passkey=1,list=1,chain=1";
  int64_t windows = 0, text_tokens = 64 << 20;
  int threads = 0, eval_digits = 7;
};

// Parses and checks the command line; false after --help.
bool parse_recall_flags(int argc, char** argv, RecallCli& c) {
  po::options_description opts(
      "h5recall --tokenizer MODEL --output DIR --text-dir TEXT --length S --windows N [options]"
      "\noptions");
  // clang-format off
  opts.add_options()
      ("help,h", "this help")
      ("tokenizer,t", po::value(&c.tokenizer)->required(), "SentencePiece .model or Hugging Face tokenizer.json")
      ("output,o", po::value(&c.output)->required(), "output folder: DIR/recall.h5, DIR/h5recall.json, DIR/tokenizer/")
      ("text-dir", po::value(&c.text)->required(),
       "training text: a folder or file of .txt, JSON Lines or h5tokenize shards (.h5 of the same tokenizer)")
      ("text-tokens", po::value(&c.text_tokens)->default_value(c.text_tokens), "tokens of --text-dir to read at most")
      ("length", po::value(&c.o.length)->required(), "tokens per window (the stage's data.seq_length)")
      ("windows", po::value(&c.windows)->required(), "windows to write")
      ("episodes", po::value(&c.o.episodes)->default_value(c.o.episodes),
       "retrieval episodes per window (fewer when their pieces would fill half of it)")
      ("min-distance", po::value(&c.o.min_distance)->default_value(0),
       "text tokens between a statement and its question, at least")
      ("max-distance", po::value(&c.o.max_distance)->default_value(0), "... at most (0: the window)")
      ("log-distance", po::bool_switch(&c.o.log_distance),
       "draw the distances log-uniformly (as many in every octave) instead of uniformly")
      ("lm-share", po::value(&c.o.lm_share)->default_value(c.o.lm_share, "0.25"),
       "share of the windows whose text tokens carry loss too (language modelling)")
      ("mix", po::value(&c.mix)->default_value(c.mix), "relative weights of the episode kinds: fact, passkey, list, chain")
      ("seed", po::value(&c.o.seed)->default_value(c.o.seed), "seed: window i is a function of (seed, i)")
      ("eval-digits", po::value(&c.eval_digits)->default_value(c.eval_digits),
       "digits of the needle evaluation's number, for eval_overhead in h5recall.json")
      ("threads", po::value(&c.threads)->default_value(0), "threads (0: OpenMP's default)");
  // clang-format on
  po::variables_map vm;
  if (!data_tools::parse_flags(argc, argv, opts, nullptr, true, "h5recall", vm)) return false;
  c.o.mix = eval::parse_episode_mix(c.mix);
  eval::check_recall_options(c.o);
  EASYCTX_CHECK_INPUT(c.windows >= 1, "--windows: ", c.windows, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(c.text_tokens >= 1, "--text-tokens: ", c.text_tokens, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(std::filesystem::is_regular_file(c.tokenizer), "--tokenizer: ", c.tokenizer, " is not a file");
  eval::check_text_source(c.text);
  if (c.threads > 0) omp_set_num_threads(c.threads);
  return true;
}

data::ShardMeta prepare_output(const std::string& output, const std::string& tokenizer, const data::Tokenizer& tok) {
  data::ShardMeta meta = data_tools::prepare_shard_output(output, tokenizer, tok);
  meta.has_loss_weights = true;
  return meta;
}

// Windows 0..n-1 built in parallel, written in order: the shard does not depend on --threads.
eval::RecallTally write_windows(const eval::RecallDocs& docs, int64_t n, data::TokenShardWriter& w) {
  eval::RecallTally tally;
  const uint16_t src_lm = w.source_index("lm"), src_recall = w.source_index("recall");
  struct Built {
    eval::RecallWindow win;
    eval::RecallTally tally;
  };
  data_tools::build_in_order<Built>(
      n,
      [&](uint64_t i) {
        Built b;
        b.win = docs.window(i, &b.tally);
        return b;
      },
      [&](const Built& b) {
        tally.add(b.tally);
        w.add_document(b.win.tokens.data(), b.win.tokens.size(), b.win.lm ? src_lm : src_recall, b.win.weights.data());
      });
  return tally;
}

// Tokens an easyctx_eval_needle prompt of context L has beyond L (EasyContext's needle with
// `digits` digits): the bench picks its eval lengths with it so that a prompt fits a window.
int64_t needle_overhead(const data::Tokenizer& tok, int digits) {
  eval::TaskOptions t;
  t.digits = digits;
  const eval::PromptBuilder b(tok, t);
  const int64_t L = 64;
  eval::Rng rng(1);
  const std::vector<uint32_t> hay = b.noise_haystack(L);
  return static_cast<int64_t>(b.needle(hay, L, 0.5, eval::random_number(rng, digits), rng).tokens.size()) - L;
}

Json summary_json(const RecallCli& c, const std::string& text, const eval::RecallTally& t, int64_t overhead) {
  Json s = Json::object(), kinds = Json::object(), dist = Json::array();
  s.set("length", c.o.length);
  s.set("windows", c.windows);
  s.set("episodes_per_window", c.o.episodes);
  s.set("min_distance", c.o.min_distance);
  s.set("max_distance", c.o.max_distance);
  s.set("log_distance", c.o.log_distance);
  s.set("lm_share", c.o.lm_share);
  s.set("mix", c.mix);
  s.set("seed", static_cast<int64_t>(c.o.seed));
  s.set("text", text);
  s.set("tokens", t.tokens);
  s.set("lm_windows", t.lm_windows);
  s.set("text_tokens", t.text_tokens);
  s.set("weighted_tokens", t.weighted_tokens);
  s.set("answer_tokens", t.answer_tokens);
  for (const auto& kv : t.episodes) kinds.set(eval::episode_kind_name(kv.first), kv.second);
  s.set("episodes", kinds);
  for (int64_t x : t.distances) dist.push_back(x);
  s.set("distance_bins", "episodes by tokens from statement to question: [0,128), [128,256), then doubling");
  s.set("distances", dist);
  s.set("longest_distance", t.longest_distance);
  Json forbidden = Json::array();
  for (const std::string& p : eval::forbidden_phrases()) forbidden.push_back(p);
  s.set("forbidden_phrases", forbidden);
  Json ov = Json::object();
  ov.set("needle", overhead);
  s.set("eval_overhead", ov);
  return s;
}

int recall_main(int argc, char** argv) {
  RecallCli c;
  if (!parse_recall_flags(argc, argv, c)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = data::load_tokenizer(c.tokenizer);
  eval::Haystack text = eval::load_text(c.text, *tok, c.text_tokens, c.o.length);
  const std::string text_desc = text.description;
  log_info("h5recall: text ", text_desc);
  const eval::RecallDocs docs(*tok, c.o, std::move(text.tokens));
  namespace fs = std::filesystem;
  data::TokenShardWriter w((fs::path(c.output) / "recall.h5").string(), prepare_output(c.output, c.tokenizer, *tok));
  const eval::RecallTally t = write_windows(docs, c.windows, w);
  const int64_t overhead = needle_overhead(*tok, c.eval_digits);
  const Json summary = summary_json(c, text_desc, t, overhead);
  w.set_extra("h5recall", summary.dump());
  w.commit();
  write_file_atomic((fs::path(c.output) / "h5recall.json").string(), summary.dump(2) + "\n");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string kinds;
  for (const auto& kv : t.episodes)
    kinds +=
        std::string(kinds.empty() ? "" : ", ") + eval::episode_kind_name(kv.first) + " " + std::to_string(kv.second);
  std::cout << "h5recall: " << c.windows << " windows of " << c.o.length << " tokens (" << t.lm_windows
            << " language-model), episodes: " << kinds << "; " << t.answer_tokens << " answer tokens, "
            << t.weighted_tokens << " weighted; longest distance " << t.longest_distance << "; "
            << format_count(static_cast<double>(w.num_tokens())) << " tokens in " << format_duration(secs) << " -> "
            << c.output << "/recall.h5\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime&) {
    log_init(LogOptions{0, LogLevel::Info, ""});
    return recall_main(argc, argv);
  });
}
