// The memory plan's items sized by the code that sizes them: the process and the backend,
// loading the weights, the micro-batch and the model's workspace, the ops' scratch, the MPI
// gradient reduction, checkpoint saves and the Hugging Face export.
#include <algorithm>

#include "ckpt/safetensors.h"
#include "core/checked.h"
#include "core/strings.h"
#include "ops/scratch.h"
#include "plan/plan_items.h"

namespace easyctx::plan::detail {
using model::BufferSpec;

std::vector<Group> group_specs(const std::vector<BufferSpec>& specs) {
  std::vector<Group> out;
  for (const BufferSpec& s : specs) {
    std::string key;
    for (const std::string& part : split(s.name, '.')) {
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      key += (key.empty() ? "" : ".") + (digits ? std::string("*") : part);
    }
    auto it = std::find_if(out.begin(), out.end(), [&](const Group& g) { return g.key == key && g.numel == s.numel; });
    if (it == out.end()) out.push_back({key, s.dtype, s.numel, 1, s.pinned_host, s.shape, s.label});
    else ++it->count;
  }
  return out;
}

std::string workspace_label(const Group& g) {
  std::string name = "workspace " + g.key + (g.label.empty() ? "" : ": " + g.label);
  if (g.count > 1) name += " x" + num(g.count);
  return name;
}

std::string workspace_formula(const Group& g) {
  return (g.count > 1 ? num(g.count) + " x " : "") + (g.shape.empty() ? num(g.numel) : g.shape) + " x " +
         num(static_cast<int64_t>(ops::element_size(g.dtype)));
}

namespace {

// LlamaModel::workspace_specs for the run (the trainer's model options).
std::vector<BufferSpec> model_buffers(const Run& r) {
  return model::LlamaModel::workspace_specs(r.mc, model::options_for(r.cfg, r.cuda), r.dtype, r.batch, r.seq, true);
}

}  // namespace

// The process and the backend: calibrated constants and the CUDA backend's own buffers; one
// rule for the training and the inference plans. The host baseline is this program's own
// footprint when the plan is made in it, before it allocates (the trainer plans first thing;
// --plan for the CPU backend; an evaluation program's session on the CPU): the libraries it
// links (a CUDA build maps cuDNN, cuBLASLt and NCCL even for the CPU backend), MPI, the config.
// On CUDA the driver's host side comes later, with the context: the calibrated constant bounds it.
void process_and_backend_items(const Run& r, const PlanTarget& t, Items& it) {
  if (r.cuda) {
    it.persistent("init", "CUDA context, cuBLASLt/cuDNN handles, NCCL (constant)", "gpu", kCudaContextBytes,
                  "kCudaContextBytes (calibrated; not a backend allocation)", false);
    for (const ops::ScratchBuffer& b : ops::cuda_own_bytes().list())
      it.persistent("init", b.name, "gpu", b.bytes, b.formula);
  }
  const int64_t fixed = r.cuda ? kHostBaselineCudaBytes : kHostBaselineCpuBytes;
  const bool measured = t.process_bytes > fixed;
  it.persistent("init", "process baseline (program, libraries, MPI" + std::string(r.cuda ? ", CUDA host side)" : ")"),
                "host", measured ? t.process_bytes : fixed,
                measured ? "VmRSS of this process before allocating (measured)"
                : r.cuda ? "kHostBaselineCudaBytes (calibrated)"
                         : "kHostBaselineCpuBytes (calibrated)",
                false);
}

void process_items(const Run& r, const PlanTarget& t, Items& it) {
  process_and_backend_items(r, t, it);
  // Loading the weights (ParamStore::load_master, read_checkpoint): each unit's part this rank
  // keeps (stage 0: the whole unit; ZeRO-3: its shard) is read into the state where that is
  // host memory (the CPU backend, offload_optimizer), else through a host staging of one part.
  const zero::ShardLayout sl = r.shards();
  auto part = [&](size_t u) { return r.zero3() ? sl.len(u) : r.layout.units()[u].numel; };
  if (r.cuda && (!r.offload_opt() || r.split_opt())) {  // (a split: the units whose state is on the GPU)
    int64_t most = 0;
    for (size_t u = 0; u < r.layout.num_units(); ++u)
      if (!r.layout.units()[u].frozen) most = std::max(most, part(u));
    it.transient("init", "host staging of one unit's part being loaded (f32)", "host", 4 * most,
                 r.zero3() ? "4 x max ceil(unit / Z)" : "4 x largest unit", false);
  }
  // LoRA's frozen units: f32 read and converted to bf16 on the host, a chunk at a time.
  int64_t frozen = 0;
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (r.layout.units()[u].frozen) frozen = std::max(frozen, std::min(part(u), kOffloadChunkElems));
  if (r.cuda && frozen > 0)
    it.transient("init", "host staging of a frozen unit's chunk being loaded (f32 + bf16)", "host", 6 * frozen,
                 "6 x min(largest frozen unit part, 2^24)", false);
  // model.init hf:DIR: SafetensorsReader::read_range's buffer (disk bytes of the elements read,
  // at most kReadChunkBytes at once; F64 on disk at most).
  if (starts_with(r.cfg.model.init, "hf:")) {
    int64_t largest = 0;
    for (const model::ParamUnit& u : r.layout.units())
      for (const model::ParamTensor& pt : u.tensors) largest = std::max(largest, pt.numel);
    const int64_t kept = r.zero3() ? std::min(largest, r.shards().max_len()) : largest;
    it.transient("init", "safetensors read buffer (model.init hf:)", "host",
                 std::min<int64_t>(8 * kept, static_cast<int64_t>(ckpt::SafetensorsReader::kReadChunkBytes)),
                 "min(8 x largest tensor part read, SafetensorsReader::kReadChunkBytes)", false);
  }
}

// From the first step on: the micro-batch and the model's workspace.
void step_items(const Run& r, Items& it) {
  const int64_t n = r.tokens;
  if (r.cuda)
    it.persistent("step", "micro-batch on the device (tokens, positions, labels)", "gpu", 3 * 4 * n, "3 x 4 x n");
  // Per sequence: its sample id and its document starts (a vector of one start, 32 bytes with
  // its header; with data.document_mask at most one 8-byte start per token of the window).
  const bool docs = r.cfg.data.document_mask;
  const int64_t per_seq = docs ? 40 + 8 * r.cfg.data.seq_length : 40;
  const int64_t mb = checked_mul<int64_t>(r.cfg.train.grad_accum, 3 * 4 * n + per_seq * r.batch,
                                          "the plan: loader micro-batch bytes, train.grad_accum x (12 n + starts)");
  it.persistent("step", "loader micro-batches (int32 tokens, positions, labels; document starts)", "host", mb,
                docs ? "grad_accum x (3 x 4 x n + (40 + 8 L) B)" : "grad_accum x (3 x 4 x n + 40 B)", false);
  for (const Group& g : group_specs(model_buffers(r))) {
    const int64_t each = checked_mul(g.numel, static_cast<int64_t>(ops::element_size(g.dtype)), "the plan: " + g.key);
    const int64_t all = checked_mul(g.count, each, "the plan: " + g.key);
    const std::string f = workspace_formula(g);
    if (g.pinned_host) {  // activation.offload cpu: Backend::alloc_host_pinned (a backend buffer on the CPU)
      it.persistent("step", workspace_label(g) + (r.cuda ? " (offloaded, pinned)" : " (offloaded)"), "host", all, f,
                    !r.cuda);
      continue;
    }
    it.persistent("step", workspace_label(g), r.dev, all, f);
  }
}

// The backends' scratch inside the other ops, from the functions they size it with (ops/scratch.h).
void op_scratch_items(const Run& r, Items& it) {
  auto scratch = [&](const std::string& phase, const std::vector<ops::ScratchBuffer>& bufs, bool tracked) {
    for (const ops::ScratchBuffer& b : bufs) it.transient(phase, b.name, r.dev, b.bytes, b.formula, tracked);
  };
  const int64_t n = r.tokens, V = r.mc.vocab_size, tile = r.cfg.activation.lm_head_tile;
  if (!r.cuda) {  // cpu::lm_head_loss keeps its tile and the per-token NLL on the heap (not backend buffers)
    scratch("LM head + loss", ops::cpu_lm_head_scratch(n, V, tile, 4).list(), false);
    return;
  }
  scratch("LM head + loss", ops::cuda_lm_head_scratch(n, V, tile, true, true).list(), true);
  scratch("RMSNorm backward", ops::rmsnorm_bwd_scratch(n, r.mc.hidden_size).list(), true);
  scratch("embedding backward", ops::embedding_bwd_scratch(n).list(), true);
  scratch("gradient clip", ops::sum_squares_scratch().list(), true);
}

// Gradient reduction over MPI (the CPU backend): MpiComm sums floats in rank order through
// heap copies, unit by unit: all_reduce holds the padded send, the received blocks and its
// own block; reduce_scatter the received blocks (then the replicas' all_reduce).
void reduction_items(const Run& r, const PlanTarget& t, Items& it) {
  if (r.cuda) return;
  int64_t unit = 0, len = 0;  // (the trainable units: LoRA's frozen ones have no gradient)
  const zero::ShardLayout sl = r.shards();
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (!r.layout.units()[u].frozen) {
      unit = std::max(unit, r.layout.units()[u].numel);
      len = std::max(len, sl.len(u));
    }
  auto all_reduce = [](int64_t count, int64_t ranks) {
    const int64_t block = (count + ranks - 1) / ranks;
    return 4 * (2 * block * ranks + block);
  };
  const int64_t G = r.groups.sp_size > 1 ? t.world() : r.groups.dp_size, R = t.world() / r.zero_group;
  int64_t bytes = 0;
  if (!r.zero3() && G > 1) bytes = all_reduce(unit, G);
  if (r.zero3() && r.zero_group > 1) bytes = 4 * len * r.zero_group;
  if (r.zero3() && R > 1) bytes = std::max(bytes, all_reduce(len, R));
  it.transient("gradient reduce", "MPI rank-ordered sum buffers (heap, largest unit)", "host", bytes,
               r.zero3() ? "4 x Z x ceil(unit / Z)" : "4 x (2 G + 1) x ceil(unit / G), G = ranks summing", false);
}

// Host staging of checkpoints and the export (CUDA stage 0: the slices this rank writes).
void save_items(const Run& r, const PlanTarget& t, Items& it) {
  const OutputConfig& out = r.cfg.output;
  const zero::ShardLayout sl = r.shards();
  int64_t trained_len = 0, trained_max = 0;  // (LoRA: the trainable units' shards only)
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (!r.layout.units()[u].frozen) {
      trained_len += sl.len(u);
      trained_max = std::max(trained_max, sl.len(u));
    }
  if (r.cuda && (!r.offload_opt() || r.split_opt()) && (out.save_final || out.save_every > 0)) {
    const int64_t W = t.world();
    const int64_t state = r.zero3() ? trained_len : (r.trained + W - 1) / W;
    const std::string f = r.zero3() ? "3 x 4 x sum ceil(unit / Z)" : "3 x 4 x P / W (the slices this rank writes)";
    it.transient("checkpoint save", "host staging of master, m, v (f32)", "host", 12 * state, f, false);
  }
  if (!out.export_hf) return;
  // The HF export (Trainer::save_hf): rank 0 holds the whole fp32 model (ParamStore::
  // master_host_at_root) and writes it one safetensors file of at most 5 GB at a time, each
  // built in memory (ckpt::write_safetensors_sharded).
  // (LoRA: the trainable units only, into one adapter file)
  const bool lora = r.layout.lora().enabled();
  const int64_t disk = r.cfg.output.hf_dtype == "bf16" ? 2 : 4, P = r.trained;
  const int64_t file = lora ? disk * P : std::min<int64_t>(disk * P, int64_t{5} << 30);
  const std::string phase = r.zero3() ? "HF export (gather)" : "HF export (rank 0)";
  const char* what = lora ? " trainable" : "";
  if (!r.zero3()) {
    it.transient(phase, std::string("the whole") + what + " master weights copied for the export (f32, heap)", "host",
                 4 * P, "4 P", false, Ranks::Root);
  } else {  // every unit gathered in turn; rank 0 keeps each, the others one at a time
    const int64_t Z = r.zero_group;
    it.transient(phase, std::string("the whole") + what + " master weights gathered on rank 0 (f32, heap)", "host",
                 4 * Z * trained_len, "4 x Z x sum ceil(unit / Z)", false, Ranks::Root);
    if (t.world() > 1)
      it.transient(phase, "one unit gathered (f32, heap; rank 0 keeps them all)", "host", 4 * Z * trained_max,
                   "4 x Z x max ceil(unit / Z)", false, Ranks::Others);
    if (r.cuda)
      it.transient(phase, "one unit gathered on the device (f32)", "gpu", 4 * r.zero_group * trained_max,
                   "4 x Z x max ceil(unit / Z)");
  }
  it.transient(phase,
               lora ? "the adapter file being written (in memory)" : "a safetensors file being written (in memory)",
               "host", file,
               lora ? std::to_string(disk) + " P (P: the trainable parameters)"
                    : "min(" + std::to_string(disk) + " P, 5 GiB): the writer's shards",
               false, Ranks::Root);
}

}  // namespace easyctx::plan::detail
