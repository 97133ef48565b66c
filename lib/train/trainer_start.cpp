// The trainer's start-up (Trainer::load_weights and its helpers): where the run starts
// (--resume, model.init), every checkpoint verified before it is loaded, the run recorded in
// output.dir (run.json, previous/), and the memory plan written for easyctx_report (plan.json).
// The step loop and the saves are in trainer.cpp.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>

#include "ckpt/hf_model.h"
#include "ckpt/rank_sync.h"
#include "ckpt/run_folder.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/log.h"
#include "core/strings.h"
#include "plan/memory_plan.h"
#include "train/trainer.h"

namespace easyctx::train {
namespace fs = std::filesystem;

namespace {

// The settings a continuation must share with the run it continues to be the same training
// (core/config.h training_settings: the keys the registry marks, and the global batch). Their
// hash goes into run.json and every index.
std::vector<std::pair<std::string, std::string>> training_identity(const StageConfig& c, int64_t dp_size) {
  return training_settings(c, dp_size);
}

std::string identity_hash(const std::vector<std::pair<std::string, std::string>>& id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const auto& [k, v] : id)
    for (char ch : k + "=" + v + "\n") h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The training settings of a checkpoint's run that differ from `now` ("" when it cannot tell).
std::string identity_changes(const ckpt::CheckpointReader& r,
                             const std::vector<std::pair<std::string, std::string>>& now) {
  try {
    const StageConfig then =
        parse_stage_config(r.meta().at("config").as_string(), r.path() + "/index.json:meta.config");
    const auto old = training_identity(then, r.meta().at("layout").at("data_parallel").as_int());
    std::string out;
    for (size_t i = 0; i < old.size() && i < now.size(); ++i)
      if (old[i].second != now[i].second)
        out += (out.empty() ? "" : "; ") + now[i].first + " " + old[i].second + " -> " + now[i].second;
    return out;
  } catch (const std::exception&) { return ""; }
}

// A checkpoint of another model shape is refused, naming the first field that differs (the
// arrays alone would not tell: a deeper model's first layers have the same sizes).
void check_same_model(const ckpt::CheckpointReader& r, const model::LlamaConfig& mc, const std::string& what) {
  const Json* m = r.meta().find("model");
  if (!m) return;
  const model::LlamaConfig c = model::llama_config_from_json(*m, r.path() + "/index.json:meta.model");
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {c.hidden_size, mc.hidden_size}},
      {"num_hidden_layers", {c.num_layers, mc.num_layers}},
      {"num_attention_heads", {c.num_heads, mc.num_heads}},
      {"num_key_value_heads", {c.num_kv_heads, mc.num_kv_heads}},
      {"head_dim", {c.head_dim, mc.head_dim}},
      {"intermediate_size", {c.intermediate_size, mc.intermediate_size}},
      {"vocab_size", {c.vocab_size, mc.vocab_size}},
      {"tie_word_embeddings", {c.tie_word_embeddings, mc.tie_word_embeddings}}};
  for (const auto& [name, v] : fields)
    EASYCTX_CHECK_INPUT(v.first == v.second, what, ": ", r.path(), " holds a different model (", name, " ", v.first,
                        "; model.config ", mc.name, " has ", v.second, ")");
}

// A stage that starts from a checkpoint trained at another RoPE theta without naming its own
// (model.rope_theta) runs at model.config's: said once, loudly, since a progressive recipe's
// stage that forgot the key would otherwise train silently at the preset's theta.
void warn_if_theta_changes(const ckpt::CheckpointReader& r, const model::LlamaConfig& mc, bool theta_set,
                           const std::string& what) {
  const Json* m = r.meta().find("model");
  if (!m) return;
  const double then = model::llama_config_from_json(*m, r.path() + "/index.json:meta.model").rope_theta;
  if (then == mc.rope_theta) return;
  if (theta_set) {
    log_info(what, ": rope_theta ", then, " in its run -> ", mc.rope_theta, " (model.rope_theta)");
    return;
  }
  log_warn(what, ": ", r.path(), " was trained at rope_theta ", then, "; this stage runs at ", mc.rope_theta,
           ", model.config's, because model.rope_theta is not set: set model.rope_theta (", then,
           " to keep it, or a larger theta to extend)");
}

Json entry_json(const ckpt::CheckpointEntry& e) {
  Json j = Json::object();
  j.set("path", e.path);
  j.set("step", e.step);
  j.set("run_id", e.run_id);
  return j;
}

// Each rank reads only the part of the model it keeps (ZeRO-3: its shards), so a problem in
// the data (a non-finite weight, a short file) may show on some ranks only: every rank's
// outcome is gathered and any failure ends the start on every rank, naming what each saw.
// Returns the bytes this rank read.
uint64_t read_agreed(ckpt::RankSync& sync, const std::string& what_read, const std::function<uint64_t()>& read) {
  std::string failure;
  uint64_t bytes = 0;
  try {
    bytes = read();
  } catch (const InputError& e) { failure = std::string("I") + e.what(); } catch (const std::exception& e) {
    failure = std::string("E") + e.what();
  }
  sync.reduce(failure, "reading " + what_read, "checking what every rank read",
              [&](const std::vector<std::string>& reports) -> std::string {
                std::string msg;
                bool input = true, all_same = true;
                for (size_t r = 0; r < reports.size(); ++r) {
                  all_same = all_same && reports[r] == reports[0];
                  if (reports[r].empty()) continue;
                  input = input && reports[r][0] == 'I';
                  msg += (msg.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                         reports[r].substr(1);
                }
                if (msg.empty()) return "";
                if (all_same) msg = reports[0].substr(1);  // (every rank read the same and saw the same)
                if (input) throw InputError(msg);
                EASYCTX_THROW(msg);
              });
  return bytes;
}

}  // namespace

int Trainer::choose_verified(ckpt::RankSync& sync, const Json& candidates, const std::string& what,
                             ckpt::VerifyScope scope) {
  std::vector<std::string> paths, problems;
  for (const Json& c : candidates.as_array()) paths.push_back(c.at("path").as_string());
  const int chosen = ckpt::first_verified(sync, paths, &problems, nullptr, scope);
  const std::string broken = join(problems, "; ");
  if (chosen >= 0 && !broken.empty() && world_.rank() == 0)
    log_warn(what, ": skipped broken checkpoint(s): ", broken, "; using ", paths[static_cast<size_t>(chosen)]);
  EASYCTX_CHECK_INPUT(chosen >= 0 || broken.empty(), what,
                      ": no checkpoint there passes verification, so nothing "
                      "was loaded and nothing in ",
                      cfg_.output.dir, " was changed: ", broken);
  return chosen;
}

// Rank 0: what this start may load, newest first (verified next), and the run the folder
// holds now: {"candidates": [{path, step, run_id}], "current": run.json or null, "note"}.
Json Trainer::plan_start() const {
  const std::string& out = cfg_.output.dir;
  const std::string ckpts = (fs::path(out) / "checkpoints").string();
  Json cands = Json::array();
  std::optional<ckpt::RunInfo> current;
  std::string note;
  if (opts_.resume == "none") {
    try {
      current = ckpt::read_run_info(out);
    } catch (const std::exception& e) { log_warn("--resume none: ", e.what(), "; replacing it"); }
  } else {
    current = ckpt::read_run_info(out);
  }
  if (opts_.resume == "auto") {
    for (const ckpt::CheckpointEntry& e : ckpt::list_checkpoints(ckpts)) {
      // (an unreadable index may be this run's: tried, and named when it fails)
      if (!current || !e.problem.empty() || ckpt::belongs_to(e.run_id, *current)) {
        cands.push_back(entry_json(e));
      } else {
        note += (note.empty() ? "" : ", ") + fs::path(e.path).filename().string() + " (run " +
                (e.run_id.empty() ? std::string("unlabelled") : e.run_id) + ")";
      }
    }
    if (!note.empty())
      note = "checkpoints of other runs in " + ckpts + " are left alone (never resumed or pruned): " + note;
    // A run started from a checkpoint (a fork) that has none of its own yet continues from
    // where it started, never from model.init.
    if (current && current->origin.find("step") && cands.size() == 0) {
      const std::string from = current->origin.at("from").as_string();
      const fs::path aside = fs::path(out) / "previous" / current->origin.at("run_id").as_string() / "checkpoints" /
                             fs::path(from).filename();
      std::string there;
      if (fs::exists(fs::path(from) / "COMMITTED")) there = from;
      else if (fs::exists(aside / "COMMITTED")) there = aside.string();
      EASYCTX_CHECK_INPUT(!there.empty(), "--resume auto: run ", current->run_id, " (", out, "/run.json) started from ",
                          from,
                          ", which is gone, and has no checkpoint of its own; resume another checkpoint "
                          "(--resume PATH) or start over (--resume none)");
      for (const ckpt::CheckpointEntry& e : ckpt::checkpoint_candidates(there, nullptr)) cands.push_back(entry_json(e));
    }
  } else if (opts_.resume != "none") {
    for (const ckpt::CheckpointEntry& e : ckpt::checkpoint_candidates(opts_.resume, &note))
      cands.push_back(entry_json(e));
    EASYCTX_CHECK_INPUT(cands.size() > 0, "--resume ", opts_.resume, ": no committed checkpoint there");
  }
  Json p = Json::object();
  p.set("candidates", cands);
  p.set("current", current ? ckpt::run_info_to_json(*current) : Json());
  p.set("note", note);
  return p;
}

namespace {

// With --resume auto the run run.json names (or, with no run.json, the checkpoint's run, adopted);
// with another --resume, that run when `chosen` is its newest checkpoint: the run to continue, or
// none (a new run starts).
std::optional<ckpt::RunInfo> run_to_continue(const std::string& resume, const std::optional<ckpt::RunInfo>& current,
                                             const Json& chosen, const std::string& ckpts,
                                             const std::string& config_hash) {
  const bool resumed = !chosen.is_null();
  if (resume == "auto") {
    if (current) return current;
    if (!resumed) return std::nullopt;
    ckpt::RunInfo info;  // no run.json (a folder from before run ids): the checkpoint's run
    info.run_id = chosen.at("run_id").as_string();
    info.adopts_unlabelled = info.run_id.empty();
    if (info.run_id.empty()) info.run_id = ckpt::new_run_id();
    info.started = ckpt::utc_now();
    info.config_hash = config_hash;
    info.origin = Json::object();
    info.origin.set("from", "adopted: " + chosen.at("path").as_string());
    return info;
  }
  if (resumed && current && chosen.at("run_id").as_string() == current->run_id &&
      fs::path(chosen.at("path").as_string()).parent_path() == fs::path(ckpts)) {
    int64_t newest = -1;
    for (const ckpt::CheckpointEntry& e : ckpt::list_checkpoints(ckpts))
      if (e.problem.empty() && ckpt::belongs_to(e.run_id, *current)) newest = std::max(newest, e.step);
    if (chosen.at("step").as_int() == newest) return current;
  }
  return std::nullopt;
}

// A new run (fresh, --resume none, or a fork of another checkpoint): where it comes from, and
// the earlier run of the folder (`cur`: run.json's, or one from before run ids) it archives.
ckpt::RunInfo new_run_info(const std::optional<ckpt::RunInfo>& current, const Json& cur, const Json& chosen,
                           const std::string& out, const std::string& config_hash, const std::string& init) {
  const bool resumed = !chosen.is_null();
  ckpt::RunInfo info;
  info.run_id = ckpt::new_run_id();
  info.config_hash = config_hash;
  info.started = ckpt::utc_now();
  info.origin = Json::object();
  if (resumed) {
    info.origin.set("from", chosen.at("path").as_string());
    info.origin.set("step", chosen.at("step").as_int());
    info.origin.set("run_id", chosen.at("run_id").as_string());
  } else {
    info.origin.set("from", "model.init");
    info.origin.set("init", init);
  }
  std::string earlier;
  if (current) {
    info.earlier_runs = current->earlier_runs;
    info.earlier_runs.push_back(current->run_id);
    earlier = current->run_id;
  } else if (fs::exists(fs::path(out) / "DONE") || fs::exists(fs::path(out) / "final") ||
             fs::exists(fs::path(out) / "metrics.jsonl") || fs::exists(fs::path(out) / "tensorboard")) {
    earlier = "unlabelled-" + ckpt::utc_now();  // a run from before run ids
  }
  if (!earlier.empty()) {
    info.archive_of = earlier;
    info.archive_info = cur;
    // A fork of that run continues its metrics history up to the fork's step.
    info.archive_keeps_metrics = current && resumed && chosen.at("run_id").as_string() == current->run_id;
  }
  return info;
}

}  // namespace

// Rank 0, once loading has succeeded: the run the folder holds from now on. The one run.json
// names is continued (auto; --resume PATH at that run's newest checkpoint); otherwise a new run
// is written to run.json before anything of it exists, and the earlier run's DONE, final/,
// metrics.jsonl and tensorboard/ move to previous/<its id>/. Returns {"run_id", "continuing"}.
Json Trainer::record_run(const Json& plan, const Json& chosen) const {
  const std::string& out = cfg_.output.dir;
  const std::string ckpts = (fs::path(out) / "checkpoints").string();
  const Json& cur = plan.at("current");
  std::optional<ckpt::RunInfo> current;
  if (!cur.is_null()) current = ckpt::run_info_from_json(cur, out + "/run.json");
  const bool resumed = !chosen.is_null();
  const std::optional<ckpt::RunInfo> continued = run_to_continue(opts_.resume, current, chosen, ckpts, config_hash_);
  const bool continuing = continued.has_value();
  ckpt::RunInfo info;
  if (!continuing) {
    info = new_run_info(current, cur, chosen, out, config_hash_, cfg_.model.init);
    ckpt::write_run_info(out, info);
    ckpt::fault_point("run_json", 0);
  } else {
    info = *continued;
    if (!current) ckpt::write_run_info(out, info);
  }
  if (!info.archive_of.empty()) {  // (also an interrupted earlier start's)
    ckpt::archive_run(out, info.archive_of, info.archive_info, info.archive_keeps_metrics);
    ckpt::fault_point("archived", 0);
    log_info("the earlier run's DONE, final/, metrics.jsonl and tensorboard/ are in ", out, "/previous/",
             info.archive_of);
    info.archive_of.clear();
    info.archive_info = Json();
    ckpt::write_run_info(out, info);
  }
  if (!continuing)
    log_info("run ", info.run_id, " starts in ", out,
             resumed ? " (a new run from " + chosen.at("path").as_string() + ")" : std::string(" (from model.init)"));
  Json a = Json::object();
  a.set("run_id", info.run_id);
  a.set("continuing", continuing);
  return a;
}

// Resumes from the checkpoint `entry` (verified): its weights, Adam moments, step and data
// cursor. Returns the training settings that changed since it was written ("" when none).
std::string Trainer::resume_weights(ckpt::RankSync& sync, const Json& entry, const std::string& what) {
  const ckpt::CheckpointReader r(entry.at("path").as_string());
  EASYCTX_CHECK_INPUT(!(r.meta().find("weights_only") && r.meta().at("weights_only").as_bool()), r.path(),
                      " holds weights only (made by easyctx_convert): start a run from it with model.init: ckpt:",
                      r.path(), ", not --resume");
  check_same_model(r, model_->config(), what);
  weights_bytes_read_ += read_agreed(sync, r.path(), [&] {
    store_->read_checkpoint(r, true);
    return r.bytes_read();
  });
  start_step_ = r.meta().at("next_step").as_int();
  // (a checkpoint from before these counts: every step was an update, none lacked labels)
  const Json* updates = r.meta().find("optimizer_updates");
  const Json* unlabelled = r.meta().find("steps_without_labels");
  updates_ = updates ? updates->as_int() : start_step_;
  no_label_steps_ = unlabelled ? unlabelled->as_int() : 0;
  const Json rank0 = r.rank_meta(0);
  if (const Json* d = rank0.find("data")) resumed_data_state_ = d->dump();
  std::string changes;
  if (!r.config_hash().empty() && r.config_hash() != config_hash_)
    changes = identity_changes(r, training_identity(cfg_, dp_.size()));
  log_info("resuming from ", r.path(), " (", start_step_, " steps done; the next is step ", start_step_ + 1, ")");
  return changes;
}

// model.init hf:DIR: the weights of a Hugging Face folder.
void Trainer::load_hf_weights(ckpt::RankSync& sync) {
  const std::string dir = cfg_.model.init.substr(3);
  weights_bytes_read_ += read_agreed(sync, cfg_.model.init, [&] {
    ckpt::HfUnitReader hf(dir, model_->layout());
    store_->load_master([&](size_t u, int64_t lo, int64_t n, float* out) { hf.read(u, lo, n, out); });
    hf.check_finite();
    return hf.bytes_read();
  });
}

// model.init ckpt:DIR: the newest checkpoint there that verifies (with its Adam moments when
// model.carry_optimizer).
void Trainer::load_ckpt_weights(ckpt::RankSync& sync) {
  const std::string init = cfg_.model.init;
  auto list = [&](const std::vector<std::string>&) {
    Json c = Json::array();
    std::string note;
    for (const ckpt::CheckpointEntry& e : ckpt::checkpoint_candidates(init.substr(5), &note))
      c.push_back(entry_json(e));
    if (!note.empty()) log_info("model.init: ", note);
    return c.dump();
  };
  const Json init_cands =
      parse_json(sync.reduce("", "loading", "listing model.init's checkpoints", list), "model.init candidates");
  EASYCTX_CHECK_INPUT(init_cands.size() > 0, "model.init: ", init, ": no committed checkpoint there");
  // Verified as far as it is read: the weights, and the Adam moments only when carried.
  const int i =
      choose_verified(sync, init_cands, "model.init: " + init,
                      cfg_.model.carry_optimizer ? ckpt::VerifyScope::Everything : ckpt::VerifyScope::Weights);
  const ckpt::CheckpointReader r(init_cands[static_cast<size_t>(i)].at("path").as_string());
  check_same_model(r, model_->config(), "model.init: " + init);
  if (sync.rank() == 0) warn_if_theta_changes(r, model_->config(), cfg_.model.rope_theta > 0, "model.init: " + init);
  if (cfg_.model.carry_optimizer)
    EASYCTX_CHECK_INPUT(!(r.meta().find("weights_only") && r.meta().at("weights_only").as_bool()),
                        "model.carry_optimizer: ", r.path(), " holds weights only (made by easyctx_convert)");
  weights_bytes_read_ += read_agreed(sync, r.path(), [&] {
    store_->read_checkpoint(r, cfg_.model.carry_optimizer);
    return r.bytes_read();
  });
  log_info("initial weights", cfg_.model.carry_optimizer ? " and Adam moments" : "", " from ", r.path());
}

// model.init random.
void Trainer::init_random_weights() {
  store_->load_master([&](size_t u, int64_t lo, int64_t n, float* out) {
    model::init_random_range(model_->layout(), u, lo, ops::Tensor(out, DType::F32, {n}), cfg_.model.init_std,
                             cfg_.train.seed);
  });
}

// Where the run starts (RunOptions), every checkpoint verified before it is loaded; the run is
// recorded in output.dir only once loading has succeeded, so a refused start changes nothing
// there. Rank 0 reads and writes the folder, the others follow its answers (ckpt::RankSync,
// under parallel.collective_timeout_s).
void Trainer::load_weights() {
  const int rank = world_.rank();
  const std::string& out = cfg_.output.dir;
  ckpt::fault_point("startup", rank);
  ckpt::RankSync sync(world_mpi_, cfg_.parallel.collective_timeout_s, "start of the run in " + out);
  config_hash_ = identity_hash(training_identity(cfg_, dp_.size()));
  const Json plan = parse_json(sync.reduce("", "starting", "listing the checkpoints",
                                           [&](const std::vector<std::string>&) { return plan_start().dump(); }),
                               "start plan");
  if (rank == 0 && !plan.at("note").as_string().empty()) log_info(plan.at("note").as_string());

  // The newest candidate that verifies (all of it: a resume loads the Adam moments and the
  // rank states too); only broken ones is an error, never a silent restart from model.init.
  const Json& cands = plan.at("candidates");
  const std::string what =
      opts_.resume == "auto" ? "--resume auto (the run " + out + "/run.json names)" : "--resume " + opts_.resume;
  const int chosen = choose_verified(sync, cands, what, ckpt::VerifyScope::Everything);
  if (chosen < 0 && opts_.resume == "auto" && !plan.at("current").is_null() && rank == 0)
    log_info("run ", plan.at("current").at("run_id").as_string(),
             " has no checkpoint yet: starting it from model.init");

  Json chosen_entry;
  std::string changes;
  if (chosen >= 0) {
    chosen_entry = cands[static_cast<size_t>(chosen)];
    changes = resume_weights(sync, chosen_entry, what);
  } else if (starts_with(cfg_.model.init, "hf:")) {
    load_hf_weights(sync);
  } else if (starts_with(cfg_.model.init, "ckpt:")) {
    load_ckpt_weights(sync);
  } else {
    init_random_weights();
  }
  if (weights_bytes_read_ > 0 && rank == 0)
    log_info("weights: rank 0 read ", format_bytes(static_cast<double>(weights_bytes_read_)),
             cfg_.parallel.zero.stage == 3 ? " (its shards: ZeRO-3 ranks read only the part they keep)" : "");

  auto record = [&](const std::vector<std::string>&) { return record_run(plan, chosen_entry).dump(); };
  const Json started = parse_json(sync.reduce("", "loading", "recording the run in run.json", record), "run record");
  run_id_ = started.at("run_id").as_string();
  const bool continuing = started.at("continuing").as_bool();
  if (continuing && rank == 0 && !changes.empty())
    log_warn("continuing run ", run_id_, " with changed training settings (", changes,
             "): the continuation is not "
             "the training its earlier steps were");
  // This run's own checkpoint, just verified: a save of the same step keeps it.
  if (continuing && chosen >= 0 && chosen_entry.at("run_id").as_string() == run_id_) last_saved_step_ = start_step_;
  ckpt::fault_point("started", rank);
}

// The memory plan this run was checked against (plan::plan_to_json: what --plan prints), for
// easyctx_report and whoever sizes the next job. A report, not the run's state: a failure to
// write it (a full disk) is a warning, and the run goes on.
void Trainer::write_plan() const {
  fs::create_directories(cfg_.output.dir);
  const std::string plan_path = (fs::path(cfg_.output.dir) / "plan.json").string();
  try {
    write_file_atomic(plan_path, plan::plan_to_json(*plan_).dump(1) + "\n");
  } catch (const std::exception& e) {  // (names the file and the cause; nothing half written is left)
    log_warn(e.what(), ": the run goes on without its plan for easyctx_report");
  }
}

}  // namespace easyctx::train
