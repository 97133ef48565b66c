#include "zero/param_store.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "zero/deferred_update.h"
#include "zero/host_adamw.h"
#include "zero/stores.h"

namespace easyctx::zero {

ParamStore::ParamStore(const model::ParamLayout& layout, ops::Backend& be, DType dtype, const StoreOptions& o,
                       const StoreComms& c)
    : layout_(layout), be_(be), dtype_(dtype), opts_(o), comms_(c) {
  if (o.offload_optimizer) {
    EASYCTX_CHECK_INPUT(on_device(), "parallel.zero.offload_optimizer: true needs train.device cuda (with the ",
                        be.name(), " backend the optimizer already runs on the host); set it to false");
    host_be_ = make_host_backend();  // master weights and Adam moments in host memory
    host_adamw_ = std::make_unique<HostAdamW>(be_, kOffloadChunkElems);
  }
  EASYCTX_CHECK_INPUT(!o.offload_params || (o.zero_stage == 3 && host_be_),
                      "parallel.zero.offload_params: true needs parallel.zero.stage 3 and "
                      "parallel.zero.offload_optimizer: true on train.device cuda (the host AdamW writes the bf16 "
                      "shards it keeps in host memory)");
  EASYCTX_CHECK_INPUT(o.offload_optimizer_layers == 0 || (o.zero_stage == 0 && host_be_),
                      "parallel.zero.offload_optimizer_layers: ", o.offload_optimizer_layers,
                      " needs parallel.zero.stage 0 and parallel.zero.offload_optimizer: true on train.device cuda");
  EASYCTX_CHECK_INPUT(!o.offload_grads || (o.zero_stage == 3 && host_be_),
                      "parallel.zero.offload_grads: true needs parallel.zero.stage 3 and "
                      "parallel.zero.offload_optimizer: true on train.device cuda (the host AdamW reads the gradient "
                      "shards it keeps in host memory)");
}

ParamStore::~ParamStore() { settle_before_destruction(); }

bool ParamStore::state_in_host(size_t u) const {
  if (!host_be_) return false;
  const int64_t layers = static_cast<int64_t>(layout_.num_units()) - 2, k = opts_.offload_optimizer_layers;
  if (k <= 0 || k >= layers) return true;
  return u >= layout_.layer_unit(layers - k);  // the last k layers and the head
}

void ParamStore::settle_before_destruction() noexcept {
  try {
    settle();
  } catch (const std::exception& e) { log_warn("the last optimizer step failed: ", e.what()); }
}

std::unique_ptr<ops::Backend> ParamStore::make_host_backend() const {
  return opts_.host_backend ? opts_.host_backend() : ops::make_cpu_backend();
}

bool ParamStore::host_resident(const std::vector<ops::Buffer>& bufs) {
  return bufs.empty() || bufs.front().flat().space == MemSpace::Host;
}

std::vector<ops::Tensor> ParamStore::host_views(const std::vector<ops::Buffer>& bufs,
                                                std::vector<std::vector<float>>& staging, bool fetch) const {
  std::vector<ops::Tensor> v;
  if (host_resident(bufs)) {
    for (const ops::Buffer& b : bufs) v.push_back(b.flat());
    return v;
  }
  staging.assign(bufs.size(), {});
  for (size_t u = 0; u < bufs.size(); ++u) {
    staging[u].resize(static_cast<size_t>(bufs[u].numel()));
    v.emplace_back(staging[u].data(), DType::F32, std::initializer_list<int64_t>{bufs[u].numel()});
    if (fetch) be_.copy(v.back(), bufs[u].flat());
  }
  return v;
}

void ParamStore::upload(std::vector<ops::Buffer>& bufs, const std::vector<std::vector<float>>& staging) {
  if (host_resident(bufs)) return;
  EASYCTX_CHECK(staging.size() == bufs.size(), "ParamStore::upload: ", staging.size(), " staged units for ",
                bufs.size());
  for (size_t u = 0; u < bufs.size(); ++u) {
    const ops::Tensor src(const_cast<float*>(staging[u].data()), DType::F32, {bufs[u].numel()});
    be_.copy(bufs[u].flat(), src);
  }
  be_.synchronize();  // the staged host memory goes away after this
}

void ParamStore::load_part(size_t u, const ops::Buffer& b, const std::function<void(int64_t, int64_t, float*)>& read) {
  const Kept k = kept(u);
  if (k.length <= 0) return;
  EASYCTX_CHECK(b.dtype() == DType::F32 && b.numel() >= k.length, "ParamStore: unit ", layout_.units()[u].name, ": ",
                k.length, " elements kept, buffer of ", b.numel());
  if (b.flat().space == MemSpace::Host) {  // (the CPU backend, or offload_optimizer's host state)
    read(k.lo, k.length, b.flat().ptr<float>());
    return;
  }
  if (k.length > load_staging_len_) {  // one staging of the largest part, reused (not zeroed: `read` writes it)
    load_staging_.reset();
    load_staging_.reset(new float[static_cast<size_t>(k.length)]);
    load_staging_len_ = k.length;
  }
  float* part = load_staging_.get();
  read(k.lo, k.length, part);
  be_.copy(b.flat().slice_flat(0, {k.length}), ops::Tensor(part, DType::F32, {k.length}));
  be_.synchronize();  // `part` is reused
}

void ParamStore::end_loading() {
  load_staging_.reset();
  load_staging_len_ = 0;
}

void ParamStore::load_master(const MasterFill& fill) {
  for (size_t u = 0; u < layout_.num_units(); ++u)
    load_part(u, master_[u], [&](int64_t lo, int64_t n, float* out) { fill(u, lo, n, out); });
  end_loading();
}

void ParamStore::read_units(const ckpt::CheckpointReader& r, ckpt::ArrayKind kind, std::vector<ops::Buffer>& bufs) {
  const auto& units = layout_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string name = ckpt::array_name(kind, units[u].name);
    EASYCTX_CHECK_INPUT(r.numel(name) == units[u].numel, r.path(), ": ", name, " has ", r.numel(name),
                        " elements, this model needs ", units[u].numel, " (different model config?)");
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string name = ckpt::array_name(kind, units[u].name);
    load_part(u, bufs[u], [&](int64_t lo, int64_t n, float* out) { r.read(name, lo, n, out); });
  }
}

std::array<std::pair<ckpt::ArrayKind, std::vector<ops::Buffer>*>, 3> ParamStore::checkpoint_arrays() {
  return {
      {{ckpt::ArrayKind::Master, &master_}, {ckpt::ArrayKind::AdamM, &adam_m_}, {ckpt::ArrayKind::AdamV, &adam_v_}}};
}

void ParamStore::read_checkpoint(const ckpt::CheckpointReader& r, bool moments) {
  for (auto [kind, bufs] : checkpoint_arrays())
    if (moments || kind == ckpt::ArrayKind::Master) read_units(r, kind, *bufs);
  end_loading();
}

void ParamStore::settle() const {
  if (host_adamw_) host_adamw_->finish();
}

HostAdamWTimes ParamStore::take_host_optimizer_times() {
  return host_adamw_ ? host_adamw_->take_times() : HostAdamWTimes();
}

void ParamStore::device_adamw(size_t u, const ops::AdamWStep& step, double weight_decay) {
  ops::AdamWStep s = step;
  const std::vector<ops::Buffer>& g = update_grads();
  for (const model::ParamTensor& t : layout_.units()[u].tensors) {
    s.weight_decay = t.decay ? weight_decay : 0.0;  // matrices only, not norm gains
    const Part q = part_of(u, t);
    if (q.a >= q.e) continue;
    auto part = [&](const ops::Buffer& b) { return b.flat().slice_flat(q.a - q.base, {q.e - q.a}); };
    be_.adamw(part(master_[u]), part(g[u]), part(adam_m_[u]), part(adam_v_[u]), s);
  }
}

std::vector<OffloadPiece> ParamStore::host_pieces(double weight_decay) const {
  const auto& units = layout_.units();
  const std::vector<ops::Buffer>& g = update_grads();
  const std::vector<ops::Buffer>& work = working();
  std::vector<OffloadPiece> pieces;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!state_in_host(u)) continue;
    for (const model::ParamTensor& t : units[u].tensors) {
      const Part q = part_of(u, t);
      if (q.a >= q.e) continue;
      const int64_t off = q.a - q.base;
      OffloadPiece p;
      p.master = master_[u].flat().ptr<float>() + off;
      p.m = adam_m_[u].flat().ptr<float>() + off;
      p.v = adam_v_[u].flat().ptr<float>() + off;
      if (g[u].flat().space == MemSpace::Host)  // offload_grads: the layers' shards in pinned host memory
        p.grad_host = g[u].flat().ptr<float>() + off;
      else p.grad_dev = g[u].flat().ptr<float>() + off;
      if (working_in_host()) p.work_host = static_cast<uint16_t*>(work[u].data()) + off;
      else p.work_dev = static_cast<uint16_t*>(work[u].data()) + off;
      p.n = q.e - q.a;
      p.weight_decay = t.decay ? weight_decay : 0.0;
      p.unit = u;
      pieces.push_back(p);
    }
  }
  return pieces;
}

void ParamStore::optimizer_step(const ops::AdamWStep& s, double weight_decay, bool defer) {
  const size_t units = layout_.num_units();
  if (!host_adamw_) {
    for (size_t u = 0; u < units; ++u) device_adamw(u, s, weight_decay);
    refresh_working_copy();
    return;
  }
  // offload_optimizer: every tensor (shard) of the units whose state is in host memory through
  // the host pipeline; those whose state is on the device (offload_optimizer_layers) updated
  // there, on the compute queue, while the host's update runs.
  std::vector<OffloadPiece> pieces = host_pieces(weight_decay);
  be_.synchronize();  // the gradients are final (backward, reduction and clipping issued to it)
  before_host_update();
  const auto device_part = [&] {
    bool any = false;
    for (size_t u = 0; u < units; ++u)
      if (!state_in_host(u)) {
        device_adamw(u, s, weight_decay);
        any = true;
      }
    if (any) refresh_device_units();
  };
  if (defer) {  // one core left to the next step's kernel launches
    host_adamw_->start(std::move(pieces), s, std::max(1, omp_get_max_threads() - 1));
    device_part();  // (before the next forward on the compute queue; each unit's gradient zeroed after it)
    deferred_->mark(units);
    after_deferred_start();
    return;
  }
  device_part();
  host_adamw_->step(pieces, s);  // (it wrote the bf16 working copy itself)
  working_copy_written();
}

std::vector<ops::Tensor> ParamStore::master() const {
  EASYCTX_THROW("master: with ZeRO-3 each rank holds only its shards; master_host() gathers them");
}

std::vector<ops::Tensor> ParamStore::gradients() const {
  EASYCTX_THROW("gradients: with ZeRO-3 each rank holds only its shard of the reduced gradients");
}

std::vector<std::vector<float>> ParamStore::gradients_host() const {
  const std::vector<ops::Tensor> g = gradients();
  std::vector<std::vector<float>> out(g.size());
  for (size_t u = 0; u < g.size(); ++u) {
    out[u].resize(static_cast<size_t>(g[u].numel()));
    be_.copy(ops::Tensor(out[u].data(), DType::F32, {g[u].numel()}), g[u]);
  }
  return out;
}

}  // namespace easyctx::zero

namespace easyctx::zero {

StoreOptions store_options(const StageConfig& cfg) {
  StoreOptions o;
  o.zero_stage = static_cast<int>(cfg.parallel.zero.stage);
  o.prefetch = static_cast<int>(cfg.parallel.zero.prefetch);
  o.offload_optimizer = cfg.parallel.zero.offload_optimizer;
  o.offload_params = cfg.parallel.zero.offload_params;
  o.offload_grads = cfg.parallel.zero.offload_grads;
  o.offload_optimizer_layers = cfg.parallel.zero.offload_optimizer_layers;
  return o;
}

double clip_by_global_norm(ops::Backend& be, const std::vector<ops::Tensor>& grads, double max_norm) {
  double ss = 0;
  for (const ops::Tensor& g : grads) ss += be.sum_squares(g);
  const double norm = std::sqrt(ss);
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0 && coef < 1.0)
    for (const ops::Tensor& g : grads) be.scale(g, coef);
  return norm;
}

std::unique_ptr<ParamStore> make_param_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                             const StoreOptions& o, const StoreComms& c) {
  EASYCTX_CHECK(o.zero_stage == 0 || o.zero_stage == 3, "parallel.zero.stage ", o.zero_stage, ": 0 or 3");
  return o.zero_stage == 3 ? make_sharded_store(layout, be, dtype, o, c)
                           : make_replicated_store(layout, be, dtype, o, c);
}

}  // namespace easyctx::zero
