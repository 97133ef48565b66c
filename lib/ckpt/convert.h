// easyctx_convert: between training checkpoints and Hugging Face model folders.
//   ckpt:DIR -> hf:OUT   the fp32 master weights of a committed checkpoint (DIR: a step
//                        folder, a checkpoints folder or a run's output.dir: the newest of its
//                        run that verifies), checksums verified first
//                        as safetensors (bf16 or f32, sharded at 5 GB with an index) plus
//                        config.json carrying the trained rope_theta, rope_scaling and
//                        max_position_embeddings (at least the stage's seq_length), so
//                        transformers and vLLM load it at the trained context.
//   hf:DIR -> ckpt:OUT   a weights-only checkpoint OUT/checkpoints/step-00000000 (no Adam
//                        state), usable as `model.init: ckpt:OUT`. OUT must hold no checkpoint
//                        and no run (refused otherwise: nothing of a run is replaced or pruned).
//   hf -> hf, ckpt -> ckpt also work (dtype change, resharding to one file).
//   ckpt:DIR -> peft:OUT a LoRA run's checkpoint as a PEFT adapter folder (lora_adapter.h):
//                        its trainable tensors, base_model_name_or_path its base's folder.
//   --merge-lora ADAPTER  the PEFT adapter merged into its base (--from, by default
//                        hf:<the adapter's base_model_name_or_path>): W + lora_alpha / r x B A
//                        on the targeted projections, modules_to_save replacing their tensors;
//                        written --to hf:OUT (or ckpt:OUT).
// Round trips are exact: f32 and bf16 both survive HF -> ckpt -> HF bit for bit.
#pragma once
#include <cstdint>
#include <string>

#include "ckpt/run_folder.h"
#include "ckpt/safetensors.h"
#include "ckpt/sharded_checkpoint.h"

namespace easyctx::ckpt {

struct ConvertOptions {
  std::string from;               // ckpt:DIR or hf:DIR
  std::string to;                 // hf:DIR or ckpt:DIR
  StDType dtype = StDType::BF16;  // HF output tensors: BF16 or F32
  uint64_t max_shard_bytes = 5ull << 30;
  double rope_theta = 0;                // > 0: override in the output config
  int64_t max_position_embeddings = 0;  // > 0: override
  std::string merge_lora;               // a PEFT adapter folder merged into --from ("": none)
};

// Returns a one-line summary. Throws InputError naming the bad argument or file.
std::string convert_model(const ConvertOptions& opts);

}  // namespace easyctx::ckpt
