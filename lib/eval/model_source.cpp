#include "eval/model_source.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "ckpt/convert.h"
#include "ckpt/run_folder.h"
#include "ckpt/hf_model.h"
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
  fs::path p(dir);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  return name.empty() ? spec : name;
}

ModelRef resolve_model(const std::string& spec, const std::string& flag) {
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

ModelRef resolve_model(const std::string& spec, MPI_Comm comm, double timeout_s, const std::string& flag) {
  if (!starts_with(spec, "ckpt:")) return resolve_model(spec, flag);
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
          continue;
        }
        const ops::Tensor host(chunk.data(), ops::DType::F32, {len});
        model::init_random_range(layout, u, off, host, kRandomStd, m.seed);
        be.copy(dst, host);
        be.synchronize();
      }
    return units;
  }
  if (!m.checkpoint) {  // a Hugging Face folder
    ckpt::for_each_hf_tensor(m.dir, layout, [&](size_t u, const model::ParamTensor& t, const float* data) {
      const ops::Tensor src(const_cast<float*>(data), ops::DType::F32, {t.numel});
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
      continue;
    }
    for (int64_t off = 0; off < pu.numel; off += kLoadChunkElems) {
      const int64_t len = std::min(kLoadChunkElems, pu.numel - off);
      r.read(name, off, len, chunk.data());
      be.copy(units[u].flat().slice_flat(off, {len}), ops::Tensor(chunk.data(), ops::DType::F32, {len}));
      be.synchronize();  // the chunk is read again next
    }
  }
  be.synchronize();
  return units;
}

}  // namespace easyctx::eval
