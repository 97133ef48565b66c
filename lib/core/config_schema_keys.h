// Internal to the stage-config key registry: the functions that add each section's keys
// (config_schema_model.cpp, config_schema_train.cpp, config_schema_parallel.cpp,
// config_schema_output.cpp; config_schema.cpp's registry() calls them in the order of
// docs/config.md) and the bounds and checks they share. Included by config_schema*.cpp only.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/config_registry.h"

namespace easyctx::config_schema {

constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();
constexpr double kMaxF = std::numeric_limits<double>::max();
// Positions are int32 and a sequence-parallel layout pads the sequence: 2^30 leaves room.
constexpr int64_t kMaxSeqLength = int64_t{1} << 30;

inline std::string check_nonempty(const std::string& s) { return s.empty() ? "a non-empty string" : ""; }

// model and data (config_schema_model.cpp)
void add_model_keys(config_registry::Registry& r);
void add_data_keys(config_registry::Registry& r);
void add_data_packing_keys(config_registry::Registry& r);
// train, its device, lora (config_schema_train.cpp)
void add_train_keys(config_registry::Registry& r);
void add_train_device_keys(config_registry::Registry& r);
void add_lora_keys(config_registry::Registry& r);
// parallel, parallel.zero, activation (config_schema_parallel.cpp)
void add_parallel_keys(config_registry::Registry& r);
void add_zero_keys(config_registry::Registry& r);
void add_activation_keys(config_registry::Registry& r);
// output, logging, target (config_schema_output.cpp)
void add_output_keys(config_registry::Registry& r);
void add_logging_keys(config_registry::Registry& r);
void add_target_keys(config_registry::Registry& r);

}  // namespace easyctx::config_schema
