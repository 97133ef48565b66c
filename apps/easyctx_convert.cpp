// easyctx_convert --from ckpt:DIR|hf:DIR --to hf:DIR|ckpt:DIR|peft:DIR [--dtype bf16|f32]
//                 [--shard-size GB] [--rope-theta X] [--max-position-embeddings N]
//                 [--merge-lora ADAPTER_DIR]
// Exports a training checkpoint as a Hugging Face model (or imports one), a LoRA run's
// checkpoint as a PEFT adapter, or merges an adapter into its base; lib/ckpt/convert.h.
#include <boost/program_options.hpp>
#include <iostream>

#include "ckpt/convert.h"
#include "core/error.h"
#include "dist/runtime.h"

namespace po = boost::program_options;
using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    po::options_description opts("easyctx_convert --from ckpt:DIR|hf:DIR --to hf:DIR|ckpt:DIR [options]");
    std::string dtype;
    double shard_gb = 5;
    ckpt::ConvertOptions o;
    opts.add_options()("help,h", "show this help")("from", po::value(&o.from),
                                                   "ckpt:DIR (checkpoint step folder, "
                                                   "checkpoints folder or run folder) or hf:DIR")(
        "to", po::value(&o.to), "hf:DIR, ckpt:DIR, or peft:DIR (a LoRA run's checkpoint as a PEFT adapter)")(
        "merge-lora", po::value(&o.merge_lora),
        "a PEFT LoRA adapter folder merged into --from (default: hf:<its base_model_name_or_path>)")(
        "dtype", po::value(&dtype)->default_value("bf16"), "tensor type of an HF output: bf16 or f32")(
        "shard-size", po::value(&shard_gb)->default_value(5), "HF output shard size in GB (10^9 bytes)")(
        "rope-theta", po::value(&o.rope_theta)->default_value(0), "override rope_theta in the output config")(
        "max-position-embeddings", po::value(&o.max_position_embeddings)->default_value(0),
        "override max_position_embeddings (default: at least the stage's seq_length)");
    po::variables_map vm;
    try {
      po::store(po::parse_command_line(argc, argv, opts), vm);
      po::notify(vm);
    } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
    if (vm.count("help")) {
      if (rt.rank() == 0) std::cout << opts;
      return 0;
    }
    EASYCTX_CHECK_INPUT((!o.from.empty() || !o.merge_lora.empty()) && !o.to.empty(),
                        "command line: --from (or --merge-lora) and --to are required (see --help)");
    EASYCTX_CHECK_INPUT(dtype == "bf16" || dtype == "f32", "--dtype ", dtype, ": expected bf16 or f32");
    EASYCTX_CHECK_INPUT(shard_gb > 0, "--shard-size ", shard_gb, ": expected > 0");
    o.dtype = dtype == "bf16" ? ckpt::StDType::BF16 : ckpt::StDType::F32;
    o.max_shard_bytes = static_cast<uint64_t>(shard_gb * 1e9);
    EASYCTX_CHECK_INPUT(rt.size() == 1, "easyctx_convert runs as one process (no mpirun)");
    const std::string done = ckpt::convert_model(o);  // (nothing printed before it succeeds)
    std::cout << "converted " << done << "\n";
    return 0;
  });
}
