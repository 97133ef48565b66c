// Hugging Face safetensors: reader with full validation and writer (single file or sharded
// with model.safetensors.index.json).
//
// File layout: u64 little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt"}}
// then the data section; offsets are relative to the start of the data section.
// The reader checks: N within the file and below 100 MB, the header is a JSON object, every
// dtype is known, every shape is non-negative, end - begin = numel * dtype size, every range
// lies inside the data section and no two ranges overlap. Errors name the file and tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/tensor.h"

namespace easyctx::ckpt {

enum class StDType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };
const char* st_dtype_name(StDType t);
size_t st_dtype_size(StDType t);

struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data section of `file`
  size_t file = 0;              // index into SafetensorsReader::files()
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // path: a .safetensors file; or a folder holding model.safetensors.index.json (sharded)
  // or exactly one *.safetensors file.
  explicit SafetensorsReader(const std::string& path);
  const std::vector<std::string>& files() const { return files_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Reads one tensor converted to f32 or f64 (F32/F64/F16/BF16 on disk); out holds numel.
  void read(const StTensor& t, ops::DType out_type, void* out) const { read_range(t, 0, t.numel(), out_type, out); }
  // Reads elements [first, first + count) of the flattened tensor, converted as read(): only
  // their bytes are read from the file, through a buffer of at most kReadChunkBytes (a ZeRO-3
  // rank loading its shard reads 1/Z of the model, and never holds more than that).
  void read_range(const StTensor& t, int64_t first, int64_t count, ops::DType out_type, void* out) const;
  // Raw bytes of one tensor.
  std::vector<char> read_raw(const StTensor& t) const;
  // Bytes read from the files' data sections so far by this reader (read, read_range, read_raw).
  uint64_t bytes_read() const { return bytes_read_; }
  // The most bytes read_range reads at once (its buffer).
  static constexpr uint64_t kReadChunkBytes = uint64_t{16} << 20;

 private:
  void parse_file(const std::string& path);
  std::vector<std::string> files_;
  std::vector<uint64_t> data_start_;  // per file: 8 + N
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytes_read_ = 0;
};

// One tensor to write: `data` holds numel elements of `src_type` (F32/F64 host memory);
// stored as `disk_type` (F32, BF16, F16 or F64).
struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  ops::DType src_type = ops::DType::F32;
  StDType disk_type = StDType::F32;
};

// Writes one file (atomically: path.tmp + rename).
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Writes dir/model.safetensors, or, when the data exceeds max_shard_bytes, shards
// dir/model-0000i-of-0000n.safetensors plus dir/model.safetensors.index.json (tensors are
// never split; order kept). Returns the files written.
std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::vector<StWriteTensor>& tensors,
                                                   uint64_t max_shard_bytes);

}  // namespace easyctx::ckpt
