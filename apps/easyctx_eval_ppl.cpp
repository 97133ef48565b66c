// easyctx_eval_ppl --model DIR|RUN_DIR --tokenized FILE... --min-tokens A --max-tokens B
//                  --tokens-step S [--samples K] [--rope-theta T] --output-file CSV
// Perplexity of a Hugging Face Llama folder over document lengths A, A+S, ..., B on the
// first K documents of pre-tokenized shards (docs/eval.md). CPU; with mpirun the documents
// are split across ranks. Logic in lib/eval.
#include <boost/program_options.hpp>
#include <iostream>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "eval/perplexity.h"

namespace po = boost::program_options;
using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    eval::PplOptions o;
    std::string out;
    double timeout_s = 3600;
    po::options_description opts("easyctx_eval_ppl [options]");
    opts.add_options()("help,h", "show this help")(
        "model", po::value(&o.model_dir)->required(),
        "Hugging Face model folder (config.json + safetensors), or a training run's output.dir (its final/)")(
        "tokenized", po::value(&o.tokenized)->multitoken()->required(), "h5tokenize shards: files, folders or globs")(
        "min-tokens", po::value(&o.min_tokens)->required(), "first length L")(
        "max-tokens", po::value(&o.max_tokens)->required(), "last length L")(
        "tokens-step", po::value(&o.tokens_step)->required(), "step between lengths")(
        "samples", po::value(&o.samples)->default_value(-1), "documents per length (first K with >= L tokens; -1: all)")(
        "rope-theta", po::value(&o.rope_theta)->default_value(0), "override the model's rope_theta (0: keep)")(
        "lm-head-tile", po::value(&o.lm_head_tile)->default_value(4096), "tokens per LM-head tile")(
        "mlp-tile", po::value(&o.mlp_tile)->default_value(16384),
        "tokens per MLP tile (0: untiled); bounds the MLP activations of long sequences")(
        "output-file", po::value(&out)->required(), "CSV to write (tokens,ppl,documents,nll)")(
        "collective-timeout-s", po::value(&timeout_s)->default_value(3600),
        "with mpirun: a rank that waits this long for the others (longer than one document's forward at "
        "--max-tokens) ends the job, naming the rank that never arrived");
    po::variables_map vm;
    try {
      po::store(po::parse_command_line(argc, argv, opts), vm);
      if (vm.count("help")) {
        if (rt.rank() == 0) std::cout << opts;
        return 0;
      }
      po::notify(vm);
    } catch (const po::error& e) {
      EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)");
    }
    LogOptions lo;
    lo.rank = rt.rank();
    log_init(lo);
    EASYCTX_CHECK_INPUT(timeout_s > 0, "--collective-timeout-s ", timeout_s, ": expected > 0");
    auto comm = dist::make_comm(MPI_COMM_WORLD, "world", dist::CommBackend::Mpi, timeout_s);
    const std::vector<eval::PplRow> rows = eval::evaluate_perplexity(o, comm.get());
    if (rt.rank() == 0) {
      write_file_atomic(out, eval::ppl_csv(rows));
      for (const eval::PplRow& r : rows)
        log_info("tokens ", r.tokens, ": ppl ", r.ppl, " over ", r.documents, " document(s)");
      log_info("wrote ", out);
    }
    return 0;
  });
}
