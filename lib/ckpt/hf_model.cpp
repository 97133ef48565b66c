#include "ckpt/hf_model.h"

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::ckpt {
namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Tensors HF checkpoints may carry that are not parameters (old rotary buffers).
bool ignorable(const std::string& name) { return ends_with(name, ".rotary_emb.inv_freq"); }

// "" when every element of the loaded tensor is finite; otherwise where the first
// non-finite one is (its index in the tensor's shape) and how many there are.
// `base`: the element of the tensor p[0] is (a part read alone); the index is the tensor's.
template <typename T>
std::string non_finite(const T* p, const std::vector<int64_t>& shape, int64_t n, int64_t base = 0) {
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) {
      if (first < 0) first = i;
      ++count;
    }
  if (first < 0) return "";
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(), rest = static_cast<size_t>(base + first); k-- > 0;) {
    idx[k] = static_cast<int64_t>(rest % static_cast<size_t>(shape[k]));
    rest /= static_cast<size_t>(shape[k]);
  }
  std::ostringstream os;
  os << p[first] << " at index " << shape_str(idx) << " (the first of " << count << " non-finite value"
     << (count > 1 ? "s" : "");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (base > 0 || n < numel) os << " in elements [" << base << ", " << base + n << ") read here";
  os << ")";
  return os.str();
}

// NaN or Inf would train as `loss nan` and be checkpointed and exported as if fine: one
// InputError naming every bad tensor (its file, dtype, the value and where).
void refuse_non_finite(const std::string& dir, const std::vector<std::string>& bad, bool to_f32) {
  if (bad.empty()) return;
  std::ostringstream os;
  os << "hf:" << dir << ": " << bad.size() << " tensor" << (bad.size() > 1 ? "s hold" : " holds")
     << " non-finite weights (NaN or Inf";
  if (to_f32) os << ", or an F64 value beyond the f32 range";
  os << "); refusing to load them: ";
  for (size_t i = 0; i < bad.size(); ++i) os << (i ? "; " : "") << bad[i];
  throw InputError(os.str());
}

std::string where_bad(const SafetensorsReader& r, const StTensor& t, const std::string& nf) {
  return "tensor '" + t.name + "' (" + r.files()[t.file] + ", " + st_dtype_name(t.dtype) + ") holds " + nf;
}

}  // namespace

namespace {

// Every parameter tensor of `layout` present in `r` with its shape and a float dtype, and
// nothing else (old rotary buffers aside); one InputError naming every problem otherwise.
void check_against_layout(const SafetensorsReader& r, const std::string& dir, const model::ParamLayout& layout) {
  std::vector<std::string> missing, bad;
  std::set<std::string> expected;
  for (size_t u = 0; u < layout.num_units(); ++u)
    for (const model::ParamTensor& pt : layout.units()[u].tensors) {
      expected.insert(pt.hf_name);
      const StTensor* t = r.find(pt.hf_name);
      if (!t) {
        missing.push_back(pt.hf_name);
        continue;
      }
      if (t->shape != pt.shape) {
        bad.push_back(pt.hf_name + " has shape " + shape_str(t->shape) + ", the config needs " + shape_str(pt.shape));
        continue;
      }
      if (t->dtype != StDType::F32 && t->dtype != StDType::BF16 && t->dtype != StDType::F16 && t->dtype != StDType::F64)
        bad.push_back(pt.hf_name + " has dtype " + st_dtype_name(t->dtype) + " (F32, BF16, F16 or F64 needed)");
    }
  std::vector<std::string> unexpected;
  for (const StTensor& t : r.tensors())
    if (!expected.count(t.name) && !ignorable(t.name)) unexpected.push_back(t.name);
  if (missing.empty() && bad.empty() && unexpected.empty()) return;
  std::ostringstream os;
  os << "model.init hf:" << dir << ": the checkpoint does not match the model config";
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    os << "; " << v.size() << " " << what << ": ";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  };
  list("missing", missing);
  list("mismatched", bad);
  list("unexpected", unexpected);
  throw InputError(os.str());
}

}  // namespace

void load_hf_weights(const std::string& dir, const model::ParamLayout& layout, const std::vector<ops::Tensor>& units) {
  EASYCTX_CHECK(units.size() == layout.num_units(), "load_hf_weights: ", layout.num_units(), " units expected");
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const ops::Tensor& dst = units[u];
    EASYCTX_CHECK(dst.space == ops::MemSpace::Host && (dst.dtype == ops::DType::F32 || dst.dtype == ops::DType::F64) &&
                      dst.numel() == layout.units()[u].numel,
                  "load_hf_weights: unit ", layout.units()[u].name, " must be host f32/f64[", layout.units()[u].numel,
                  "], got ", dst.describe());
  }
  SafetensorsReader r(dir);
  check_against_layout(r, dir, layout);
  std::vector<std::string> not_finite;
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const ops::Tensor& dst = units[u];
    const size_t es = ops::element_size(dst.dtype);
    for (const model::ParamTensor& pt : layout.units()[u].tensors) {
      const StTensor& t = *r.find(pt.hf_name);
      void* out = static_cast<char*>(dst.data) + static_cast<size_t>(pt.offset) * es;
      r.read(t, dst.dtype, out);
      const std::string nf = dst.dtype == ops::DType::F32
                                 ? non_finite(static_cast<const float*>(out), pt.shape, pt.numel)
                                 : non_finite(static_cast<const double*>(out), pt.shape, pt.numel);
      if (!nf.empty()) not_finite.push_back(where_bad(r, t, nf));
    }
  }
  refuse_non_finite(dir, not_finite, !units.empty() && units[0].dtype == ops::DType::F32);
}

HfUnitReader::HfUnitReader(const std::string& dir, const model::ParamLayout& layout)
    : dir_(dir), layout_(layout), reader_(dir) {
  check_against_layout(reader_, dir, layout);
}

void HfUnitReader::read(size_t unit, int64_t offset, int64_t length, float* out) {
  EASYCTX_CHECK(unit < layout_.num_units(), "HfUnitReader: unit ", unit, " of ", layout_.num_units());
  const model::ParamUnit& pu = layout_.units()[unit];
  EASYCTX_CHECK(offset >= 0 && length >= 0 && offset + length <= pu.numel, "HfUnitReader: [", offset, ", ",
                offset + length, ") of unit ", pu.name, " (", pu.numel, " elements)");
  for (const model::ParamTensor& pt : pu.tensors) {
    const int64_t a = std::max(offset, pt.offset), b = std::min(offset + length, pt.offset + pt.numel);
    if (a >= b) continue;
    const StTensor& t = *reader_.find(pt.hf_name);
    float* dst = out + (a - offset);
    reader_.read_range(t, a - pt.offset, b - a, ops::DType::F32, dst);
    const std::string nf = non_finite(dst, pt.shape, b - a, a - pt.offset);
    if (!nf.empty()) not_finite_.push_back(where_bad(reader_, t, nf));
  }
}

void HfUnitReader::check_finite() const { refuse_non_finite(dir_, not_finite_, true); }

void for_each_hf_tensor(const std::string& dir, const model::ParamLayout& layout,
                        const std::function<void(size_t, const model::ParamTensor&, float*)>& sink) {
  SafetensorsReader r(dir);
  check_against_layout(r, dir, layout);
  std::vector<float> buf;
  std::vector<std::string> not_finite;  // (refused once every tensor was read: all are named)
  for (size_t u = 0; u < layout.num_units(); ++u)
    for (const model::ParamTensor& pt : layout.units()[u].tensors) {
      const StTensor& t = *r.find(pt.hf_name);
      buf.resize(static_cast<size_t>(pt.numel));
      r.read(t, ops::DType::F32, buf.data());
      const std::string nf = non_finite(buf.data(), pt.shape, pt.numel);
      if (!nf.empty()) not_finite.push_back(where_bad(r, t, nf));
      sink(u, pt, buf.data());
    }
  refuse_non_finite(dir, not_finite, true);
}

void save_hf_model(const std::string& dir, const model::LlamaConfig& cfg, const model::ParamLayout& layout,
                   const std::vector<ops::Tensor>& units, StDType dtype, uint64_t max_shard_bytes) {
  EASYCTX_CHECK(dtype == StDType::F32 || dtype == StDType::BF16, "save_hf_model: F32 or BF16");
  EASYCTX_CHECK(units.size() == layout.num_units(), "save_hf_model: ", layout.num_units(), " units expected");
  fs::create_directories(dir);
  std::vector<StWriteTensor> ts;
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const ops::Tensor& src = units[u];
    EASYCTX_CHECK(src.space == ops::MemSpace::Host && (src.dtype == ops::DType::F32 || src.dtype == ops::DType::F64),
                  "save_hf_model: unit ", layout.units()[u].name, " must be host f32/f64");
    EASYCTX_CHECK(src.numel() == layout.units()[u].numel, "save_hf_model: unit ", layout.units()[u].name, " has ",
                  src.numel(), " elements, the model needs ", layout.units()[u].numel);
    for (const model::ParamTensor& pt : layout.units()[u].tensors) {
      StWriteTensor w;
      w.name = pt.hf_name;
      w.shape = pt.shape;
      w.data = static_cast<const char*>(src.data) + static_cast<size_t>(pt.offset) * ops::element_size(src.dtype);
      w.src_type = src.dtype;
      w.disk_type = dtype;
      ts.push_back(std::move(w));
    }
  }
  write_safetensors_sharded(dir, ts, max_shard_bytes);
  write_file_atomic((fs::path(dir) / "config.json").string(),
                    cfg.to_hf_json(dtype == StDType::BF16 ? "bfloat16" : "float32").dump(2) + "\n");
}

}  // namespace easyctx::ckpt
