#include "eval/model_source.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "ckpt/convert.h"
#include "ckpt/run_folder.h"
#include "ckpt/hf_model.h"
#include "ckpt/lora_adapter.h"
#include "ckpt/rank_sync.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "model/llama.h"

namespace easyctx::eval {
namespace fs = std::filesystem;

namespace {
constexpr double kRandomStd = 0.02;  // HF's initializer_range
constexpr const char* kAdapterMark = "+adapter:";

// "MODEL+adapter:DIR" -> (MODEL, DIR); a plain spec -> (spec, "").
std::pair<std::string, std::string> split_adapter(const std::string& spec) {
  const size_t at = spec.rfind(kAdapterMark);
  if (at == std::string::npos) return {spec, ""};
  return {spec.substr(0, at), spec.substr(at + std::string(kAdapterMark).size())};
}

// The adapter (if any) checked and recorded in m; an adapter folder given as the model (no
// config.json, an adapter_config.json) stands for its base with it.
ModelRef with_adapter_of(ModelRef m, const std::string& spec, const std::string& adapter) {
  m.spec = spec;
  if (adapter.empty()) return m;
  const ckpt::LoraAdapter a(adapter);  // (its config and file read and checked here, before any weight)
  m.adapter = adapter;
  return m;
}

ModelRef resolve_plain(const std::string& spec, const std::string& flag);
ModelRef resolve_checkpoint(const std::string& spec, MPI_Comm comm, double timeout_s, const std::string& flag);

// An adapter folder as the model: its base_model_name_or_path, a Hugging Face folder.
std::string base_of_adapter(const std::string& dir, const std::string& flag) {
  const ckpt::LoraAdapter a(dir);
  EASYCTX_CHECK_INPUT(!a.base_model().empty() && fs::exists(fs::path(a.base_model()) / "config.json"), flag, " ", dir,
                      ": a PEFT adapter folder whose base_model_name_or_path (", a.base_model(),
                      ") is not a Hugging Face folder here; give the base as the model and the adapter with "
                      "--adapter ",
                      dir);
  return a.base_model();
}

// A ckpt: model at the checkpoint its resolution verified (an InputError when the folder held
// none): the one tail of both resolve_model overloads.
ModelRef with_checkpoint(ModelRef m, const ckpt::CheckpointRef& ref, const std::string& flag) {
  EASYCTX_CHECK_INPUT(ref.step >= 0, flag, " ", m.spec,
                      ": no committed checkpoint there (a step folder, a "
                      "checkpoints folder or a run's output.dir)");
  m.dir = ref.path;
  m.step = ref.step;
  return m;
}
}  // namespace

std::string ModelRef::label() const {
  auto last = [](const std::string& d) {
    const fs::path p(d);
    const std::string name = p.filename().string();
    return name.empty() ? p.parent_path().filename().string() : name;
  };
  const std::string name = last(dir);
  return (name.empty() ? spec : name) + (adapter.empty() ? "" : "+" + last(adapter));
}

std::string with_adapter(const std::string& spec, const std::string& adapter) {
  return adapter.empty() ? spec : spec + kAdapterMark + adapter;
}

ModelRef resolve_model(const std::string& full, const std::string& flag) {
  auto [spec, adapter] = split_adapter(full);
  const std::string dir = starts_with(spec, "hf:") ? spec.substr(3) : spec;
  if (adapter.empty() && fs::exists(fs::path(dir) / "adapter_config.json") &&
      !fs::exists(fs::path(dir) / "config.json")) {
    adapter = dir;  // an adapter folder: its base, with it
    spec = base_of_adapter(dir, flag);
  }
  return with_adapter_of(resolve_plain(spec, flag), full, adapter);
}

namespace {
ModelRef resolve_plain(const std::string& spec, const std::string& flag) {
  ModelRef m;
  m.spec = spec;
  EASYCTX_CHECK_INPUT(!spec.empty(), flag, ": empty (a Hugging Face folder, hf:DIR, ckpt:DIR or random:SPEC)");
  if (starts_with(spec, "random:")) {
    m.random = true;
    m.dir = spec.substr(7);
    const size_t at = m.dir.rfind('@');
    if (at != std::string::npos) {
      const std::string seed = m.dir.substr(at + 1);
      EASYCTX_CHECK_INPUT(!seed.empty() && seed.find_first_not_of("0123456789") == std::string::npos, flag, " ", spec,
                          ": the seed after @ must be a non-negative integer");
      m.seed = std::stoull(seed);
      m.dir = m.dir.substr(0, at);
    }
    EASYCTX_CHECK_INPUT(!m.dir.empty(), flag, " ", spec,
                        ": random:SPEC needs a model shape (a preset, YAML or "
                        "config.json)");
    return m;
  }
  if (starts_with(spec, "ckpt:")) {
    m.checkpoint = true;
    const std::string dir = spec.substr(5);
    EASYCTX_CHECK_INPUT(fs::is_directory(dir), flag, " ", spec, ": no such folder");
    std::vector<std::string> warnings;
    // Checksums first: of the weights it loads (the Adam moments are not read).
    const ckpt::CheckpointRef ref = ckpt::resolve_verified(dir, &warnings, ckpt::VerifyScope::Weights);
    for (const std::string& w : warnings) log_warn(flag, " ", spec, ": ", w);
    return with_checkpoint(m, ref, flag);
  }
  m.dir = starts_with(spec, "hf:") ? spec.substr(3) : spec;
  EASYCTX_CHECK_INPUT(fs::is_directory(m.dir), flag, " ", spec,
                      ": does not exist (expected a Hugging Face folder "
                      "with config.json and safetensors, a training run's output.dir, or ckpt:DIR)");
  // A training run's output.dir: its final/ export (the folder a user has at hand).
  if (!fs::exists(fs::path(m.dir) / "config.json") && fs::exists(fs::path(m.dir) / "final" / "config.json")) {
    // Said once per process: the model is resolved by the plan, the session and the app alike.
    static std::set<std::string> said;
    if (said.insert(spec).second)
      log_info(flag, " ", spec, " is a training run: evaluating its export ", (fs::path(m.dir) / "final").string());
    m.dir = (fs::path(m.dir) / "final").string();
  }
  EASYCTX_CHECK_INPUT(fs::exists(fs::path(m.dir) / "config.json") || !fs::is_directory(fs::path(m.dir) / "checkpoints"),
                      flag, " ", spec,
                      ": a training run without a final/ export (not finished, or "
                      "output.export_hf false): evaluate its checkpoint with ",
                      flag, " ckpt:", m.dir, ", or export one with `easyctx_convert --from ckpt:", m.dir,
                      " --to hf:OUT`");
  EASYCTX_CHECK_INPUT(fs::exists(fs::path(m.dir) / "config.json"), flag, " ", spec, ": no config.json in ", m.dir,
                      " (a Hugging Face folder; a training checkpoint is ckpt:DIR)");
  return m;
}

}  // namespace

ModelRef resolve_model(const std::string& full, MPI_Comm comm, double timeout_s, const std::string& flag) {
  const auto [spec, adapter] = split_adapter(full);
  if (!starts_with(spec, "ckpt:")) return resolve_model(full, flag);
  return with_adapter_of(resolve_checkpoint(spec, comm, timeout_s, flag), full, adapter);
}

namespace {
ModelRef resolve_checkpoint(const std::string& spec, MPI_Comm comm, double timeout_s, const std::string& flag) {
  ModelRef m;
  m.spec = spec;
  m.checkpoint = true;
  const std::string dir = spec.substr(5);
  ckpt::RankSync sync(comm, timeout_s, flag + " " + spec);
  // Rank 0 looks (every rank takes part in every exchange, whatever it would have seen).
  std::error_code ec;  // (never throws: an exception here would leave the other ranks waiting)
  const std::string missing = sync.rank() == 0 && !fs::is_directory(dir, ec) ? "missing" : "";
  EASYCTX_CHECK_INPUT(sync.bcast(missing, "looking for " + dir).empty(), flag, " ", spec, ": no such folder");
  std::vector<std::string> warnings;
  // Checksums first, shared: of the weights it loads (the Adam moments are not read).
  const ckpt::CheckpointRef ref = ckpt::resolve_verified(sync, dir, &warnings, ckpt::VerifyScope::Weights);
  if (sync.rank() == 0)
    for (const std::string& w : warnings) log_warn(flag, " ", spec, ": ", w);
  return with_checkpoint(m, ref, flag);
}

}  // namespace

model::LlamaConfig model_config(const ModelRef& m, double rope_theta) {
  model::LlamaConfig c;
  if (m.random) {
    c = model::load_llama_config(m.dir);
  } else if (m.checkpoint) {
    const ckpt::CheckpointReader r(m.dir);
    EASYCTX_CHECK_INPUT(r.meta().find("model"), m.dir, "/index.json: no model config in the metadata (meta.model)");
    c = model::llama_config_from_json(r.meta().at("model"), m.dir + "/index.json:meta.model");
  } else {
    c = model::load_llama_config(m.dir);
  }
  if (rope_theta > 0) c.rope_theta = rope_theta;
  c.validate();
  return c;
}

int64_t load_staging_elems(const ModelRef& m, const model::ParamLayout& layout) {
  int64_t most = 0;
  for (const model::ParamUnit& u : layout.units()) {
    if (m.checkpoint || m.random) most = std::max(most, std::min(u.numel, kLoadChunkElems));
    else
      for (const model::ParamTensor& t : u.tensors) most = std::max(most, t.numel);
  }
  return most;
}

std::vector<ops::Buffer> load_model_weights(const ModelRef& m, const model::ParamLayout& layout, ops::Backend& be,
                                            ops::DType dtype) {
  std::unique_ptr<ckpt::LoraAdapter> adapter;
  if (!m.adapter.empty()) {
    adapter = std::make_unique<ckpt::LoraAdapter>(m.adapter);
    adapter->check(model::ParamLayout(model_config(m), adapter->spec()));
  }
  // Elements [off, off + len) of unit u, in host f32 `p`: the adapter merged in.
  auto merge = [&](size_t u, int64_t off, int64_t len, float* p) {
    if (adapter) ckpt::merge_lora_range(layout, u, off, len, p, *adapter);
  };
  std::vector<ops::Buffer> units;
  for (const model::ParamUnit& u : layout.units()) units.push_back(be.alloc(dtype, u.numel, "weights"));
  // f32 on a host backend: read straight into the units.
  const bool in_place = dtype == ops::DType::F32 && be.memspace() == MemSpace::Host;
  if (m.random) {
    std::vector<float> chunk(in_place ? 0 : static_cast<size_t>(load_staging_elems(m, layout)));
    for (size_t u = 0; u < layout.num_units(); ++u)
      for (int64_t off = 0; off < layout.units()[u].numel; off += kLoadChunkElems) {
        const int64_t len = std::min(kLoadChunkElems, layout.units()[u].numel - off);
        const ops::Tensor dst = units[u].flat().slice_flat(off, {len});
        if (in_place) {
          model::init_random_range(layout, u, off, dst, kRandomStd, m.seed);
          merge(u, off, len, dst.ptr<float>());
          continue;
        }
        const ops::Tensor host(chunk.data(), ops::DType::F32, {len});
        model::init_random_range(layout, u, off, host, kRandomStd, m.seed);
        merge(u, off, len, chunk.data());
        be.copy(dst, host);
        be.synchronize();
      }
    return units;
  }
  if (!m.checkpoint) {  // a Hugging Face folder
    ckpt::for_each_hf_tensor(m.dir, layout, [&](size_t u, const model::ParamTensor& t, float* data) {
      if (adapter) adapter->merge(t, 0, t.numel, data);
      const ops::Tensor src(data, ops::DType::F32, {t.numel});
      be.copy(units[u].flat().slice_flat(t.offset, {t.numel}), src);
      be.synchronize();  // the host buffer holds the next tensor next
    });
    return units;
  }
  const ckpt::CheckpointReader r(m.dir);
  std::vector<float> chunk(in_place ? 0 : static_cast<size_t>(load_staging_elems(m, layout)));
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const model::ParamUnit& pu = layout.units()[u];
    const std::string name = ckpt::array_name(ckpt::ArrayKind::Master, pu.name);
    EASYCTX_CHECK_INPUT(r.numel(name) == pu.numel, m.dir, ": ", name, " has ", r.numel(name),
                        " elements, the model in its index needs ", pu.numel);
    if (in_place) {
      r.read(name, 0, pu.numel, units[u].flat().ptr<float>());
      merge(u, 0, pu.numel, units[u].flat().ptr<float>());
      continue;
    }
    for (int64_t off = 0; off < pu.numel; off += kLoadChunkElems) {
      const int64_t len = std::min(kLoadChunkElems, pu.numel - off);
      r.read(name, off, len, chunk.data());
      merge(u, off, len, chunk.data());
      be.copy(units[u].flat().slice_flat(off, {len}), ops::Tensor(chunk.data(), ops::DType::F32, {len}));
      be.synchronize();  // the chunk is read again next
    }
  }
  be.synchronize();
  return units;
}

}  // namespace easyctx::eval
