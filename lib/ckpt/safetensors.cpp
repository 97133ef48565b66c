#include "ckpt/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/checked.h"
#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "ops/half.h"

namespace easyctx::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // what the safetensors library accepts

const StDType kAll[] = {StDType::F64, StDType::F32, StDType::F16, StDType::BF16, StDType::I64,
                        StDType::I32, StDType::I16, StDType::I8,  StDType::U8,   StDType::BOOL};

bool parse_dtype(const std::string& s, StDType& out) {
  for (StDType t : kAll)
    if (s == st_dtype_name(t)) {
      out = t;
      return true;
    }
  return false;
}

uint64_t read_u64_le(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

}  // namespace

const char* st_dtype_name(StDType t) {
  switch (t) {
    case StDType::F64: return "F64";
    case StDType::F32: return "F32";
    case StDType::F16: return "F16";
    case StDType::BF16: return "BF16";
    case StDType::I64: return "I64";
    case StDType::I32: return "I32";
    case StDType::I16: return "I16";
    case StDType::I8: return "I8";
    case StDType::U8: return "U8";
    case StDType::BOOL: return "BOOL";
  }
  return "?";
}

size_t st_dtype_size(StDType t) {
  switch (t) {
    case StDType::F64:
    case StDType::I64: return 8;
    case StDType::F32:
    case StDType::I32: return 4;
    case StDType::F16:
    case StDType::BF16:
    case StDType::I16: return 2;
    default: return 1;
  }
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) {
  if (!fs::is_directory(path)) {
    EASYCTX_CHECK_INPUT(fs::is_regular_file(path), "safetensors: '", path, "' does not exist");
    parse_file(path);
    return;
  }
  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    const Json j = parse_json(read_file(index.string()), index.string());
    const Json* wm = j.find("weight_map");
    EASYCTX_CHECK_INPUT(wm && wm->is_object(), index.string(), ": missing object 'weight_map'");
    std::set<std::string> shard_names;
    for (const auto& kv : wm->as_object()) {
      EASYCTX_CHECK_INPUT(kv.second.is_string(), index.string(), ": weight_map['", kv.first, "'] is not a string");
      EASYCTX_CHECK_INPUT(kv.second.as_string().find('/') == std::string::npos, index.string(), ": shard name '",
                          kv.second.as_string(), "' must be a plain file name");
      shard_names.insert(kv.second.as_string());
    }
    for (const std::string& s : shard_names) parse_file((fs::path(path) / s).string());
    for (const auto& kv : wm->as_object()) {
      const StTensor* t = find(kv.first);
      EASYCTX_CHECK_INPUT(t, index.string(), ": tensor '", kv.first, "' is listed in weight_map (file ",
                          kv.second.as_string(), ") but not stored there");
      EASYCTX_CHECK_INPUT(fs::path(files_[t->file]).filename() == kv.second.as_string(), index.string(), ": tensor '",
                          kv.first, "' is in ", files_[t->file], ", weight_map says ", kv.second.as_string());
    }
    return;
  }
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  EASYCTX_CHECK_INPUT(found.size() == 1, "safetensors: folder '", path, "' has ", found.size(),
                      " .safetensors files and no model.safetensors.index.json");
  parse_file(found[0]);
}

void SafetensorsReader::parse_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EASYCTX_CHECK_INPUT(in, "safetensors: cannot open '", path, "'");
  const uint64_t size = fs::file_size(path);
  EASYCTX_CHECK_INPUT(size >= 8, path, ": truncated file (", size, " bytes; the 8-byte header length is missing)");
  unsigned char lenbuf[8];
  in.read(reinterpret_cast<char*>(lenbuf), 8);
  const uint64_t n = read_u64_le(lenbuf);
  EASYCTX_CHECK_INPUT(n <= kMaxHeader, path, ": header length ", n, " exceeds the 100 MB limit (corrupt file?)");
  EASYCTX_CHECK_INPUT(n <= size - 8, path, ": header length ", n, " runs past the end of the ", size, "-byte file");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EASYCTX_CHECK_INPUT(in, path, ": could not read the ", n, "-byte header");
  Json j;
  try {
    j = parse_json(header, path + " header");
  } catch (const Error& e) { EASYCTX_THROW_INPUT(path, ": header is not valid JSON: ", e.what()); }
  EASYCTX_CHECK_INPUT(j.is_object(), path, ": header is not a JSON object");
  const size_t file = files_.size();
  files_.push_back(path);
  data_start_.push_back(8 + n);
  const uint64_t data_len = size - 8 - n;
  std::vector<size_t> mine;
  for (const auto& kv : j.as_object()) {
    if (kv.first == "__metadata__") {
      if (kv.second.is_object())
        for (const auto& m : kv.second.as_object())
          if (m.second.is_string()) metadata_[m.first] = m.second.as_string();
      continue;
    }
    const std::string where = path + ": tensor '" + kv.first + "'";
    const Json& e = kv.second;
    EASYCTX_CHECK_INPUT(e.is_object(), where, ": entry is not an object");
    StTensor t;
    t.name = kv.first;
    t.file = file;
    const Json* dt = e.find("dtype");
    EASYCTX_CHECK_INPUT(dt && dt->is_string() && parse_dtype(dt->as_string(), t.dtype), where, ": unknown dtype ",
                        dt ? dt->dump() : "(missing)");
    const Json* sh = e.find("shape");
    EASYCTX_CHECK_INPUT(sh && sh->is_array(), where, ": missing 'shape'");
    for (const Json& d : sh->as_array()) {
      EASYCTX_CHECK_INPUT(d.is_integer() && d.as_int() >= 0, where, ": bad shape entry ", d.dump());
      t.shape.push_back(d.as_int());
    }
    const Json* off = e.find("data_offsets");
    EASYCTX_CHECK_INPUT(off && off->is_array() && off->size() == 2 && (*off)[0].is_integer() &&
                            (*off)[1].is_integer() && (*off)[0].as_int() >= 0 && (*off)[1].as_int() >= 0,
                        where, ": 'data_offsets' must be two non-negative integers");
    t.begin = static_cast<uint64_t>((*off)[0].as_int());
    t.end = static_cast<uint64_t>((*off)[1].as_int());
    EASYCTX_CHECK_INPUT(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] are reversed");
    int64_t numel = 1;  // overflow-checked here, so numel() can multiply plainly
    for (int64_t d : t.shape) numel = checked_elements({numel, d}, where + ": shape");
    const uint64_t want = static_cast<uint64_t>(numel) * st_dtype_size(t.dtype);
    EASYCTX_CHECK_INPUT(t.end - t.begin == want, where, ": ", t.end - t.begin, " bytes stored but shape ",
                        Json(static_cast<int64_t>(t.shape.size())).dump(), "-d ", st_dtype_name(t.dtype), " needs ",
                        want);
    EASYCTX_CHECK_INPUT(t.end <= data_len, where, ": data_offsets [", t.begin, ", ", t.end,
                        "] run past the end of the data section (", data_len, " bytes; file truncated?)");
    EASYCTX_CHECK_INPUT(index_.count(t.name) == 0, where, ": stored twice (also in ",
                        files_[tensors_[index_[t.name]].file], ")");
    index_[t.name] = tensors_.size();
    mine.push_back(tensors_.size());
    tensors_.push_back(std::move(t));
  }
  std::sort(mine.begin(), mine.end(), [&](size_t a, size_t b) { return tensors_[a].begin < tensors_[b].begin; });
  for (size_t i = 1; i < mine.size(); ++i) {
    const StTensor& a = tensors_[mine[i - 1]];
    const StTensor& b = tensors_[mine[i]];
    EASYCTX_CHECK_INPUT(b.begin >= a.end || a.begin == a.end || b.begin == b.end, path, ": tensors '", a.name, "' [",
                        a.begin, ", ", a.end, ") and '", b.name, "' [", b.begin, ", ", b.end, ") overlap");
  }
}

const StTensor* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<char> SafetensorsReader::read_raw(const StTensor& t) const {
  std::ifstream in(files_.at(t.file), std::ios::binary);
  EASYCTX_CHECK_INPUT(in, "safetensors: cannot open '", files_[t.file], "'");
  std::vector<char> buf(t.end - t.begin);
  in.seekg(static_cast<std::streamoff>(data_start_[t.file] + t.begin));
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  EASYCTX_CHECK_INPUT(in, files_[t.file], ": short read of tensor '", t.name, "'");
  bytes_read_ += buf.size();
  return buf;
}

void SafetensorsReader::read_range(const StTensor& t, int64_t first, int64_t count, ops::DType out_type,
                                   void* out) const {
  EASYCTX_CHECK(out_type == ops::DType::F32 || out_type == ops::DType::F64, "safetensors read: f32 or f64 output");
  EASYCTX_CHECK_INPUT(
      t.dtype == StDType::F32 || t.dtype == StDType::F64 || t.dtype == StDType::F16 || t.dtype == StDType::BF16,
      files_[t.file], ": tensor '", t.name, "' has dtype ", st_dtype_name(t.dtype),
      "; only F32, F64, F16 and BF16 can be loaded as weights");
  const int64_t n = t.numel();
  EASYCTX_CHECK(first >= 0 && count >= 0 && first <= n && count <= n - first, "safetensors read_range: [", first, ", ",
                first + count, ") of tensor '", t.name, "' (", n, " elements)");
  if (count == 0) return;
  std::ifstream in(files_.at(t.file), std::ios::binary);
  EASYCTX_CHECK_INPUT(in, "safetensors: cannot open '", files_[t.file], "'");
  const uint64_t es = st_dtype_size(t.dtype);
  const int64_t per_chunk = static_cast<int64_t>(kReadChunkBytes / es);
  std::vector<char> raw(static_cast<size_t>(std::min(count, per_chunk)) * es);
  in.seekg(static_cast<std::streamoff>(data_start_[t.file] + t.begin + static_cast<uint64_t>(first) * es));
  for (int64_t done = 0; done < count;) {
    const int64_t m = std::min(count - done, per_chunk);
    in.read(raw.data(), static_cast<std::streamsize>(static_cast<uint64_t>(m) * es));
    EASYCTX_CHECK_INPUT(in, files_[t.file], ": short read of tensor '", t.name, "' (elements [", first + done, ", ",
                        first + done + m, "))");
    bytes_read_ += static_cast<uint64_t>(m) * es;
    for (int64_t i = 0; i < m; ++i) {
      double x = 0;
      switch (t.dtype) {
        case StDType::F32: {
          float f;
          std::memcpy(&f, raw.data() + 4 * i, 4);
          x = f;
          break;
        }
        case StDType::F64: std::memcpy(&x, raw.data() + 8 * i, 8); break;
        case StDType::F16: {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * i, 2);
          x = ops::f16_to_float(h);
          break;
        }
        case StDType::BF16: {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * i, 2);
          x = ops::bf16_to_float(h);
          break;
        }
        default: break;
      }
      if (out_type == ops::DType::F32) static_cast<float*>(out)[done + i] = static_cast<float>(x);
      else static_cast<double*>(out)[done + i] = x;
    }
    done += m;
  }
}

namespace {

// Appends the tensor's bytes in its disk dtype.
void encode(const StWriteTensor& t, int64_t n, std::string& out) {
  const size_t es = st_dtype_size(t.disk_type);
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(n) * es);
  char* dst = out.data() + base;
  for (int64_t i = 0; i < n; ++i) {
    const double x =
        t.src_type == ops::DType::F64 ? static_cast<const double*>(t.data)[i] : static_cast<const float*>(t.data)[i];
    switch (t.disk_type) {
      case StDType::F32: {
        float f = static_cast<float>(x);
        std::memcpy(dst + 4 * i, &f, 4);
        break;
      }
      case StDType::F64: std::memcpy(dst + 8 * i, &x, 8); break;
      case StDType::BF16: {
        uint16_t h = ops::float_to_bf16(static_cast<float>(x));
        std::memcpy(dst + 2 * i, &h, 2);
        break;
      }
      case StDType::F16: {
        uint16_t h = ops::float_to_f16(static_cast<float>(x));
        std::memcpy(dst + 2 * i, &h, 2);
        break;
      }
      default: EASYCTX_THROW("write_safetensors: unsupported disk dtype ", st_dtype_name(t.disk_type));
    }
  }
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // The header from the sizes first, then every tensor encoded straight into the file's
  // buffer: the file is held in memory once (an export's 5 GB shard, not twice that).
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& kv : metadata) m.set(kv.first, kv.second);
    header.set("__metadata__", m);
  }
  uint64_t data_bytes = 0;
  for (const StWriteTensor& t : tensors) {
    EASYCTX_CHECK(t.src_type == ops::DType::F32 || t.src_type == ops::DType::F64, "write_safetensors: tensor '", t.name,
                  "' source must be f32 or f64");
    const uint64_t begin = data_bytes;
    data_bytes += static_cast<uint64_t>(numel_of(t.shape)) * st_dtype_size(t.disk_type);
    Json e = Json::object();
    e.set("dtype", st_dtype_name(t.disk_type));
    Json shape = Json::array();
    for (int64_t d : t.shape) shape.push_back(Json(d));
    e.set("shape", shape);
    Json off = Json::array();
    off.push_back(Json(static_cast<int64_t>(begin)));
    off.push_back(Json(static_cast<int64_t>(data_bytes)));
    e.set("data_offsets", off);
    header.set(t.name, e);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
  std::string file(8, '\0');
  file.reserve(8 + h.size() + data_bytes);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  file += h;
  for (const StWriteTensor& t : tensors) encode(t, numel_of(t.shape), file);
  write_file_atomic(path, file);
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::vector<StWriteTensor>& tensors,
                                                   uint64_t max_shard_bytes) {
  fs::create_directories(dir);
  std::vector<std::vector<StWriteTensor>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const StWriteTensor& t : tensors) {
    const uint64_t b = static_cast<uint64_t>(numel_of(t.shape)) * st_dtype_size(t.disk_type);
    if (cur > 0 && cur + b > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
    total += b;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    written.push_back((fs::path(dir) / "model.safetensors").string());
    write_safetensors(written[0], tensors);
    return written;
  }
  Json weight_map = Json::object();
  const size_t k = shards.size();
  for (size_t i = 0; i < k; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, k);
    written.push_back((fs::path(dir) / name).string());
    write_safetensors(written.back(), shards[i]);
    for (const StWriteTensor& t : shards[i]) weight_map.set(t.name, std::string(name));
  }
  Json index = Json::object();
  Json meta = Json::object();
  meta.set("total_size", static_cast<int64_t>(total));
  index.set("metadata", meta);
  index.set("weight_map", weight_map);
  write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  return written;
}

}  // namespace easyctx::ckpt
