// h5tokenize: corpus (.jsonl, .jsonl.zst, .txt; files, folders, globs) -> pre-tokenized
// HDF5 token shards. Run under `mpirun -np N` to spread work units over ranks; --threads
// tokenizes inside a rank. See docs/data.md.
#include <boost/program_options.hpp>
#include <sentencepiece_processor.h>

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/tokenize/h5tokenize_run.h"
#include "data/tokenize/tokenizer.h"
#include "dist/runtime.h"
#include "tool_flags.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {
std::vector<std::string> dotted(const std::string& s) {
  std::vector<std::string> v = split(s, '.');
  for (const auto& p : v) EASYCTX_CHECK_INPUT(!p.empty(), "field path '", s, "' has an empty component");
  return v;
}

// <output>/tokenizer/: the tokenizer the shards were made with, and the metadata Hugging Face
// transformers expects for Llama, so that an export of a model trained on these shards
// carries its tokenizer (lib/ckpt/tokenizer_files.h): tokenizer.model (SentencePiece) or
// tokenizer.json, plus tokenizer_config.json and special_tokens_map.json (copied when the
// tokenizer's folder has them, as a Hugging Face model folder does; written otherwise).
void write_tokenizer_folder(const data::TokenizeOptions& o) {
  namespace fs = std::filesystem;
  const fs::path src(o.tokenizer), dir = fs::path(o.output) / "tokenizer";
  const bool hf = src.extension() == ".json";
  fs::create_directories(dir);
  fs::copy_file(src, dir / (hf ? "tokenizer.json" : "tokenizer.model"), fs::copy_options::overwrite_existing);
  int copied = 0;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::is_regular_file(src.parent_path() / name)) {
      fs::copy_file(src.parent_path() / name, dir / name, fs::copy_options::overwrite_existing);
      ++copied;
    }
  if (copied == 2) return;
  // The special tokens' text: SentencePiece pieces, or a tokenizer.json's added tokens.
  std::string bos, eos, unk;
  if (!hf) {
    sentencepiece::SentencePieceProcessor sp;
    EASYCTX_CHECK_INPUT(sp.Load(o.tokenizer).ok(), "cannot load ", o.tokenizer);
    if (sp.bos_id() >= 0) bos = sp.IdToPiece(sp.bos_id());
    if (sp.eos_id() >= 0) eos = sp.IdToPiece(sp.eos_id());
    if (sp.unk_id() >= 0) unk = sp.IdToPiece(sp.unk_id());
  } else {
    auto tok = data::load_tokenizer(o.tokenizer);
    const auto text = [&](int64_t id) {
      const uint32_t u = static_cast<uint32_t>(id);
      return id >= 0 ? tok->decode(&u, 1) : std::string();
    };
    bos = text(tok->bos_id());
    eos = text(tok->eos_id());
  }
  Json map = Json::object();
  if (!bos.empty()) map.set("bos_token", bos);
  if (!eos.empty()) map.set("eos_token", eos);
  if (!unk.empty()) map.set("unk_token", unk);
  Json cfg = Json::object();
  cfg.set("tokenizer_class", hf ? "PreTrainedTokenizerFast" : "LlamaTokenizer");
  cfg.set("bos_token", bos.empty() ? Json(nullptr) : Json(bos));
  cfg.set("eos_token", eos.empty() ? Json(nullptr) : Json(eos));
  if (!hf) {
    cfg.set("unk_token", unk.empty() ? Json(nullptr) : Json(unk));
    cfg.set("add_bos_token", o.add_bos);  // as the shards were made
    cfg.set("add_eos_token", o.add_eos);
    cfg.set("legacy", false);
    cfg.set("sp_model_kwargs", Json::object());
  }
  cfg.set("pad_token", nullptr);
  cfg.set("clean_up_tokenization_spaces", false);
  write_file_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
  write_file_atomic((dir / "special_tokens_map.json").string(), map.dump(2) + "\n");
}

int tokenize_main(dist::Runtime& rt, int argc, char** argv) {
  data::TokenizeOptions o;
  std::string text_field = "text", source_field = "meta.redpajama_set_name", upsample = "none", loss_on = "assistant";
  double total_tokens = 0;
  po::options_description opts("h5tokenize --tokenizer MODEL --output DIR [options] INPUT...\noptions");
  opts.add_options()("help,h", "show this help")("tokenizer,t", po::value(&o.tokenizer)->required(),
                                                 "SentencePiece .model or Hugging Face tokenizer.json")(
      "output,o", po::value(&o.output)->required(), "output folder for shard-<unit>-<part>.h5")(
      "text-field", po::value(&text_field)->default_value(text_field), "JSON field of the text (dotted path)")(
      "source-field", po::value(&source_field)->default_value(source_field),
      "JSON field of the source name (dotted path)")(
      "default-source", po::value(&o.fields.default_source)->default_value(o.fields.default_source),
      "source name for .txt inputs and records without a source field")(
      "no-bos", "do not prepend BOS to each document")("eos", "append EOS to each document")(
      "upsample", po::value(&upsample)->default_value(upsample),
      "none | per_source | global | upsample_code_arxiv_book (Fu et al. length upsampling)")(
      "total-tokens", po::value(&total_tokens)->default_value(0), "token budget for upsampling (estimated tokens)")(
      "short-threshold", po::value(&o.upsample.threshold)->default_value(o.upsample.threshold),
      "estimated tokens below which a document is short")(
      "keep-prob", po::value(&o.upsample.keep_prob)->default_value(o.upsample.keep_prob, "0.1"),
      "keep probability of short documents")(
      "chars-per-token", po::value(&o.upsample.chars_per_token)->default_value(o.upsample.chars_per_token, "3.68"),
      "length estimate: characters per token")("seed", po::value(&o.upsample.seed)->default_value(o.upsample.seed),
                                               "seed of the upsampling draws")(
      "shard-tokens", po::value(&o.shard_tokens)->default_value(o.shard_tokens),
      "close a shard once it holds this many tokens")(
      "chunk-tokens", po::value(&o.chunk_tokens)->default_value(o.chunk_tokens), "HDF5 chunk size of /tokens")(
      "deflate", po::value(&o.deflate)->default_value(0), "gzip level 0-9 for /tokens (0: none)")(
      "split-bytes", po::value(&o.split_bytes)->default_value(o.split_bytes), "work unit size in input bytes")(
      "threads", po::value(&o.threads)->default_value(1), "tokenizer threads per rank")(
      "max-doc-bytes", po::value(&o.max_doc_bytes)->default_value(o.max_doc_bytes),
      "a record (JSON line or .txt file) longer than this is an error naming the file and line; a document "
      "takes about 7x its size in memory (the tokenizer works on pieces of 256 KiB to 1 MiB)")(
      "format", po::value(&o.format)->default_value(o.format),
      "text | chat | auto: chat records are {\"messages\": [{\"role\", \"content\"}]} or prompt/response, "
      "rendered with --chat-template and stored with loss weights; auto: chat when --chat-template or --loss-on is "
      "given, else when chat records outnumber text records among the first 64 of each of the first 16 files")(
      "chat-template", po::value(&o.chat_template)->default_value(o.chat_template),
      "llama2 | llama3 | chatml | auto (the chat_template of tokenizer_config.json next to the tokenizer)")(
      "loss-on", po::value(&loss_on)->default_value(loss_on),
      "chat: assistant (loss weight 1 on assistant turns and their end token, 0 elsewhere) | all")(
      "strict", "malformed records are fatal instead of skipped")(
      "max-skipped-fraction", po::value(&o.max_skipped_fraction)->default_value(o.max_skipped_fraction, "0.01"),
      "the run fails (after writing, naming the files and the first skipped FILE:LINE) when more than this share "
      "of its records is skipped as malformed; 1: never")("overwrite",
                                                          "delete existing shards in the output folder first")(
      "progress", po::value(&o.progress)->default_value(-1),
      "progress: 0 off; otherwise rank 0 rewrites one line twice a second on a terminal, or prints a line every 30 s "
      "to a log file")("max-warnings", po::value(&o.max_warnings)->default_value(o.max_warnings),
                       "malformed-record warnings printed per rank")("input", po::value(&o.inputs)->composing(),
                                                                     "input files, folders or globs");
  po::variables_map vm;
  if (!data_tools::parse_tool_flags(rt, argc, argv, opts, "input", "h5tokenize", vm)) return 0;
  o.fields.text_path = dotted(text_field);
  o.fields.source_path = dotted(source_field);
  o.add_bos = !vm.count("no-bos");
  o.add_eos = vm.count("eos") > 0;
  o.strict = vm.count("strict") > 0;
  o.overwrite = vm.count("overwrite") > 0;
  EASYCTX_CHECK_INPUT(loss_on == "assistant" || loss_on == "all", "--loss-on ", loss_on, ": expected assistant or all");
  o.loss_on_all = loss_on == "all";
  o.loss_on_given = !vm["loss-on"].defaulted();
  o.upsample.mode = data::parse_upsample_mode(upsample);
  o.upsample.total_tokens = total_tokens;
  EASYCTX_CHECK_INPUT(o.deflate >= 0 && o.deflate <= 9, "--deflate must be 0..9");
  data::TokenizeStats st;
  std::string skipped;  // too many records skipped: the output is written, the run fails
  try {
    st = data::run_h5tokenize(o, MPI_COMM_WORLD);
  } catch (const data::SkippedRecordsError& e) {
    st = e.stats;
    skipped = e.what();
  }
  if (rt.rank() == 0) {
    write_tokenizer_folder(o);
    std::cout << st.format() << std::flush;
  }
  if (!skipped.empty()) throw dist::AgreedFailure(rt.rank() == 0 ? skipped : "", 2, rt.rank() == 0);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  // (run_main ignores SIGXFSZ first: under ulimit -f a write fails with EFBIG, which the shard
  // writer reports naming the file, instead of the signal killing the run mid-shard.)
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) {
    log_init(LogOptions{rt.rank(), LogLevel::Info, ""});
    return tokenize_main(rt, argc, argv);
  });
}
