// The trainer's LoRA (lora.rank > 0; docs/training.md, "LoRA"): where the frozen base and the
// trainable tensors' first values come from, the base's identity a checkpoint records (a LoRA
// checkpoint holds the trainable tensors and their Adam moments only, so it names the base it
// needs and refuses another), and the PEFT adapter export.
//   model.init random | hf:DIR | ckpt:DIR of a full fine-tune: that is the base; the adapters
//     start as PEFT's (A Kaiming-uniform from train.seed, B zero), the trainable copies (the
//     embedding, norms, lm_head) as the base's tensors, or everything trainable from
//     model.adapter (a PEFT folder).
//   model.init ckpt:DIR of a LoRA run: its base (checked against the fingerprint it recorded)
//     and its trainable tensors (with model.carry_optimizer, their Adam moments).
#include <cstdio>
#include <filesystem>

#include "ckpt/hf_model.h"
#include "ckpt/lora_adapter.h"
#include "ckpt/tokenizer_files.h"
#include "core/log.h"
#include "core/strings.h"
#include "train/start_detail.h"
#include "train/trainer.h"

namespace easyctx::train {
namespace fs = std::filesystem;
using namespace detail;

namespace {

std::string hash_text(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

std::unique_ptr<ckpt::LoraAdapter> Trainer::merged_adapter() const {
  if (cfg_.model.adapter.empty() || model_->layout().lora().enabled()) return nullptr;
  auto a = std::make_unique<ckpt::LoraAdapter>(cfg_.model.adapter);
  a->check(model::ParamLayout(model_->config(), a->spec()));  // (every tensor it merges, shapes checked)
  return a;
}

std::string Trainer::base_fingerprint(const std::string& init) const {
  if (starts_with(init, "hf:")) return "hf " + ckpt::hf_fingerprint(init.substr(3));
  if (starts_with(init, "ckpt:")) return "ckpt " + trim(read_file(init.substr(5) + "/COMMITTED"));
  char std_text[32];
  std::snprintf(std_text, sizeof std_text, "%.17g", cfg_.model.init_std);
  return "random seed " + std::to_string(cfg_.train.seed) + " std " + std_text + " model " +
         hash_text(model_->config().to_hf_json().dump());
}

void Trainer::check_lora_checkpoint(const ckpt::CheckpointReader& r, const std::string& what) const {
  const Json* l = r.meta().find("lora");
  const model::LoraSpec& mine = model_->layout().lora();
  if (!mine.enabled()) {
    EASYCTX_CHECK_INPUT(!l, what, ": ", r.path(),
                        " is a LoRA run's checkpoint (its trainable tensors only, on the base its index names); "
                        "continue it with the lora section it was trained with, or merge it into its base first "
                        "(easyctx_convert --from ckpt:",
                        r.path(), " --to peft:DIR, then easyctx_convert --merge-lora DIR --to hf:OUT)");
    return;
  }
  EASYCTX_CHECK_INPUT(l, what, ": ", r.path(),
                      " holds a full fine-tune's weights, not LoRA adapters; start a LoRA stage from it with "
                      "model.init: ckpt:",
                      r.path(), " (its weights become the frozen base) and --resume none");
  const std::string diff = model::lora_difference(ckpt::lora_spec_from_json(*l, r.path() + "/index.json"), mine);
  EASYCTX_CHECK_INPUT(diff.empty(), what, ": ", r.path(), " was trained with another lora section (", diff,
                      ", the checkpoint's first); set the lora section it was trained with");
  const Json& base = l->at("base");
  EASYCTX_CHECK_INPUT(base.at("fingerprint").as_string() == lora_base_fingerprint_, what, ": ", r.path(),
                      " holds adapters trained on the base ", base.at("init").as_string(), " (fingerprint ",
                      base.at("fingerprint").as_string(), "), but this run's base is ", lora_base_init_,
                      " (fingerprint ", lora_base_fingerprint_,
                      "): adapters only fit the weights they were trained on; set model.init to that base");
}

Json Trainer::lora_meta() const {
  Json l = ckpt::lora_spec_json(model_->layout().lora());
  Json base = Json::object();
  base.set("init", lora_base_init_);
  base.set("fingerprint", lora_base_fingerprint_);
  l.set("base", base);
  return l;
}

// The base's units (frozen) and the trainable tensors' first values, read as each rank keeps
// them (ZeRO-3: its shards). Returns the bytes read.
uint64_t Trainer::load_lora_base(const std::string& init, ckpt::LoraAdapter* adapter) {
  const model::ParamLayout& layout = model_->layout();
  const model::ParamLayout base(model_->config());
  const uint64_t extra = adapter ? adapter->bytes_read() : 0;
  auto fill_with = [&](const ckpt::BaseRead& read) {
    store_->load_master([&](size_t u, int64_t lo, int64_t n, float* out) {
      ckpt::fill_lora_range(layout, u, lo, n, out, read, adapter, cfg_.train.seed);
    });
    return (adapter ? adapter->bytes_read() : 0) - extra;
  };
  if (starts_with(init, "hf:")) {
    ckpt::HfUnitReader hf(init.substr(3), base);
    const uint64_t a = fill_with([&](size_t u, int64_t o, int64_t n, float* out) { hf.read(u, o, n, out); });
    hf.check_finite();
    return hf.bytes_read() + a;
  }
  if (starts_with(init, "ckpt:")) {
    const ckpt::CheckpointReader r(init.substr(5));
    const uint64_t a = fill_with([&](size_t u, int64_t o, int64_t n, float* out) {
      r.read(ckpt::array_name(ckpt::ArrayKind::Master, base.units()[u].name), o, n, out);
    });
    return r.bytes_read() + a;
  }
  return fill_with([&](size_t u, int64_t o, int64_t n, float* out) {
    model::init_random_range(base, u, o, ops::Tensor(out, DType::F32, {n}), cfg_.model.init_std, cfg_.train.seed);
  });
}

void Trainer::load_lora_weights(ckpt::RankSync& sync, bool resuming) {
  std::string init = cfg_.model.init;
  std::unique_ptr<ckpt::CheckpointReader> from;  // a LoRA run's checkpoint: the trainable tensors' start
  if (starts_with(init, "ckpt:")) {
    from = std::make_unique<ckpt::CheckpointReader>(verified_init_checkpoint(sync));
    check_same_model(*from, model_->config(), "model.init: " + cfg_.model.init);
    if (sync.rank() == 0 && !resuming)
      warn_if_theta_changes(*from, model_->config(), cfg_.model.rope_theta > 0, "model.init: " + cfg_.model.init);
    if (const Json* l = from->meta().find("lora")) {
      init = l->at("base").at("init").as_string();
    } else {  // (a full fine-tune's: the base)
      init = "ckpt:" + from->path();
      from.reset();
    }
  }
  lora_base_init_ = init;
  lora_base_fingerprint_ = base_fingerprint(init);
  if (from) check_lora_checkpoint(*from, "model.init: " + cfg_.model.init);
  std::unique_ptr<ckpt::LoraAdapter> adapter;
  if (!cfg_.model.adapter.empty()) {
    EASYCTX_CHECK_INPUT(!from, "model.adapter with model.init ", cfg_.model.init,
                        " (a LoRA run's checkpoint): the trainable tensors would come from both; drop one");
    adapter = std::make_unique<ckpt::LoraAdapter>(cfg_.model.adapter);
    const std::string diff = model::lora_difference(adapter->spec(), model_->layout().lora());
    EASYCTX_CHECK_INPUT(diff.empty(), "model.adapter ", cfg_.model.adapter,
                        ": the adapter's config and the lora "
                        "section differ (",
                        diff, ", the adapter's first); set the lora section to the adapter's");
    adapter->check(model_->layout());
  }
  weights_bytes_read_ += read_agreed(sync, init, [&] { return load_lora_base(init, adapter.get()); });
  if (from && !resuming)
    weights_bytes_read_ += read_agreed(sync, from->path(), [&] {
      store_->read_checkpoint(*from, cfg_.model.carry_optimizer);
      return from->bytes_read();
    });
  log_info("lora: ", model_->layout().lora().describe(), "; frozen base ", init, " (",
           format_count(static_cast<double>(model_->layout().frozen_numel())), " parameters), ",
           format_count(static_cast<double>(model_->layout().trainable_numel())), " trainable",
           from      ? " from " + from->path()
           : adapter ? " from " + adapter->dir()
                     : std::string());
}

void Trainer::save_lora_export(const std::string& dir) const {
  std::vector<std::vector<float>> units = store_->master_host_at_root();  // (ZeRO-3: collective)
  if (world_.rank() != 0) return;
  std::vector<ops::Tensor> views;
  for (std::vector<float>& u : units)
    views.emplace_back(u.empty() ? nullptr : u.data(), DType::F32,
                       std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
  const std::string base = starts_with(lora_base_init_, "hf:") ? lora_base_init_.substr(3) : lora_base_init_;
  ckpt::save_lora_adapter(dir, model_->layout(), views,
                          starts_with(lora_base_init_, "hf:") ? fs::absolute(base).string() : base,
                          cfg_.output.hf_dtype == "bf16" ? ckpt::StDType::BF16 : ckpt::StDType::F32);
  const std::string tok = ckpt::export_tokenizer_files(cfg_.data.path, dir);
  if (!tok.empty()) log_info("tokenizer: ", tok);
}

}  // namespace easyctx::train
