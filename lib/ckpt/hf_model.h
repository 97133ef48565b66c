// Hugging Face model folders (config.json + safetensors) <-> easyctx parameter units.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "model/llama_config.h"
#include "model/param_layout.h"
#include "ops/tensor.h"

namespace easyctx::ckpt {

// Fills host unit buffers (f32 or f64, one per layout unit) from the safetensors in `dir`
// (one file or sharded). Checks every tensor's presence, dtype and shape against the
// layout; all missing, unexpected and mismatched tensors are named in one InputError. Every
// weight must be finite once loaded: NaN or Inf (or an F64 value beyond f32 when loading f32)
// is an InputError naming each such tensor, its file and the index of its first bad value.
void load_hf_weights(const std::string& dir, const model::ParamLayout& layout, const std::vector<ops::Tensor>& units);

// Parts of the parameter units from a Hugging Face folder, reading only the bytes of the
// elements asked for: what a ZeRO-3 rank loading its shard of every unit needs (1/Z of the
// model read and held, never the whole). The folder is checked against the layout as
// load_hf_weights does (presence, dtype, shape of every tensor) when the reader is made.
class HfUnitReader {
 public:
  HfUnitReader(const std::string& dir, const model::ParamLayout& layout);
  // Elements [offset, offset + length) of unit u (its tensors laid out as the layout says)
  // into host f32 `out`, from the tensors overlapping that range.
  void read(size_t unit, int64_t offset, int64_t length, float* out);
  // Throws the InputError load_hf_weights would for the non-finite values read so far (each
  // bad tensor named with its file, dtype, first bad value and its index in the tensor; the
  // count is of the part read).
  void check_finite() const;
  uint64_t bytes_read() const { return reader_.bytes_read(); }
  const SafetensorsReader& safetensors() const { return reader_; }

 private:
  std::string dir_;
  const model::ParamLayout& layout_;
  SafetensorsReader reader_;
  std::vector<std::string> not_finite_;
};

// The same checks (all before any tensor is read), then each parameter tensor converted to
// f32 in one reused host buffer and handed to sink(unit index, tensor, data), in layout
// order: the host holds the largest tensor, never the whole model (the evaluations load a
// model onto a device this way, in bf16). The sink may change the buffer (an adapter merged in).
void for_each_hf_tensor(const std::string& dir, const model::ParamLayout& layout,
                        const std::function<void(size_t unit, const model::ParamTensor& t, float* data)>& sink);

// Writes dir/config.json and the weights (dtype F32 or BF16), sharded above max_shard_bytes.
void save_hf_model(const std::string& dir, const model::LlamaConfig& cfg, const model::ParamLayout& layout,
                   const std::vector<ops::Tensor>& units, StDType dtype = StDType::F32,
                   uint64_t max_shard_bytes = 5ull << 30);

}  // namespace easyctx::ckpt
