// Internal to lib/train: the start-up's helpers that trainer_start.cpp and trainer_lora.cpp share.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/rank_sync.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/json.h"
#include "model/llama_config.h"

namespace easyctx::train::detail {

// A checkpoint of another model shape is refused, naming the first field that differs.
void check_same_model(const ckpt::CheckpointReader& r, const model::LlamaConfig& mc, const std::string& what);
// A stage starting from a checkpoint trained at another RoPE theta without its own: said once.
void warn_if_theta_changes(const ckpt::CheckpointReader& r, const model::LlamaConfig& mc, bool theta_set,
                           const std::string& what);
Json entry_json(const ckpt::CheckpointEntry& e);
// Every rank reads its part (`read` returns its bytes); any rank's failure ends the start on
// every rank, naming what each saw.
uint64_t read_agreed(ckpt::RankSync& sync, const std::string& what_read, const std::function<uint64_t()>& read);

}  // namespace easyctx::train::detail
