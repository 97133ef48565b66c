// SFT on chats whose prompts are longer than data.seq_length (issue 53), end to end on the CPU:
// a chat JSONL made here -> h5tokenize --format chat --chat-template chatml -> easyctx_train.
// Such a chat cut by `long_documents: split` has pieces that hold only prompt tokens (loss
// weight 0 everywhere), and at batch 1 with window packing whole global batches have no
// labelled token; the run used to end there ("the global batch has no labelled tokens"), and
// `--resume auto` died on the same step forever. Checked:
//  - best_fit with the document mask: the prompt-only pieces are left out (the log says how
//    many, naming the first), every step trains, the log's last count says 0 steps without a
//    labelled token;
//  - window packing at batch 1: the run finishes its steps; each step without a labelled token
//    is in metrics.jsonl with "no_labels": true, "labels": 0 and no loss or grad_norm, the log
//    names its window (file and tokens) and counts such steps from 1, and the end count equals
//    the records';
//  - kill -9 loops during that run (killed after a step's record, at random steps, then
//    `--resume auto` until DONE): the final weights and metrics.jsonl equal the uninterrupted
//    run's bit for bit, no-update steps included (they advance neither Adam's step count nor
//    the weights, on either side of a resume).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

#include "core/json.h"
#include "core/strings.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using easyctx::test::CommandResult;
using easyctx::test::run_command;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Chats: a user prompt of random words (some far longer than `L` tokens), an assistant answer of
// a few words; one byte is one token (the ChatML byte tokenizer).
std::string chat_jsonl(std::mt19937_64& rng, int n, int64_t L) {
  static const char* words[] = {"alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"};
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int64_t prompt_bytes = rng() % 3 == 0 ? 8 + static_cast<int64_t>(rng() % 24)
                                                : L + static_cast<int64_t>(rng() % static_cast<uint64_t>(3 * L));
    std::string prompt;
    while (static_cast<int64_t>(prompt.size()) < prompt_bytes) prompt += std::string(words[rng() % 8]) + " ";
    std::string answer = words[rng() % 8];
    answer += std::string(" ") + words[rng() % 8];
    Json user = Json::object(), assistant = Json::object(), messages = Json::array(), rec = Json::object();
    user.set("role", "user");
    user.set("content", prompt);
    assistant.set("role", "assistant");
    assistant.set("content", answer);
    messages.push_back(user);
    messages.push_back(assistant);
    rec.set("messages", messages);
    out += rec.dump() + "\n";
  }
  return out;
}

struct Sft {
  ScratchDir dir{"sft-faults"};
  std::string train = easyctx::test::bin_dir() + "/easyctx_train";
  int64_t L = 0;
  uint64_t seed = 0;

  // The shards of `chats` chats at sequence length L (drawn).
  void make_data(std::mt19937_64& rng, int chats) {
    const std::string h5tok = easyctx::test::bin_dir() + "/h5tokenize";
    ASSERT_TRUE(fs::exists(h5tok) && fs::exists(train)) << "build h5tokenize and easyctx_train first";
    L = 48 + 16 * static_cast<int64_t>(rng() % 3);
    seed = rng() % 100000;
    easyctx::test::write_text(dir / "chat.jsonl", chat_jsonl(rng, chats, L));
    easyctx::test::write_text(dir / "tok.json", easyctx::test::chatml_byte_tokenizer_json());
    const CommandResult r = run_command(h5tok + " -t " + dir / "tok.json" + " -o " + dir / "data" +
                                        " --format chat --chat-template chatml " + dir / "chat.jsonl");
    ASSERT_EQ(r.status, 0) << r.output;
    easyctx::test::write_text(dir / "model.yaml",
                              "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                              "head_dim: 8\nintermediate_size: 64\nvocab_size: 258\nmax_position_embeddings: 1024\n"
                              "rms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\n");
  }

  std::string stage(const std::string& name, const std::string& packing, int64_t steps) const {
    std::ostringstream y;
    y << "model: {config: " << dir / "model.yaml"
      << ", init: random}\n"
      << "data: {path: " << dir / "data"
      << ", seq_length: " << L << ", packing: " << packing << ", document_mask: true}\n"
      << "train: {device: cpu, steps: " << steps << ", seed: " << seed
      << ", batch_size: 1, lr: 3.0e-3, schedule: cosine, warmup_steps: 3}\n"
      << "activation: {checkpoint: none}\n"
      << "output: {dir: " << dir / name << ", save_every: 3, hf_dtype: f32}\n"
      << "logging: {every: 1}\n";
    const std::string path = dir / (name + ".yaml");
    easyctx::test::write_text(path, y.str());
    return path;
  }
};

std::vector<Json> records(const std::string& path) {
  std::vector<Json> out;
  for (const std::string& line : split(easyctx::test::read_text(path), '\n'))
    if (!line.empty()) out.push_back(parse_json(line, path));
  return out;
}

// metrics.jsonl without its wall-clock fields.
std::vector<std::string> metrics_of(const std::string& run) {
  std::vector<std::string> out;
  for (const Json& j : records(run + "/metrics.jsonl")) out.push_back(test::without_wall_clock(j));
  return out;
}

// "N of S steps had no labelled token" from the end of a log (-1: not there).
int64_t steps_without_labels(const std::string& log) {
  const size_t at = log.rfind(" steps had no labelled token");
  if (at == std::string::npos) return -1;
  const size_t of = log.rfind(" of ", at);
  size_t b = of;
  while (b > 0 && std::isdigit(static_cast<unsigned char>(log[b - 1]))) --b;
  return std::stoll(log.substr(b, of - b));
}

}  // namespace

// best_fit + document mask: the prompt-only pieces are left out, every step trains.
TEST(SftFaults, PromptsLongerThanSeqLengthPackedFinish) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  Sft s;
  s.make_data(rng, 40);
  if (HasFatalFailure()) return;
  const int64_t steps = 12;
  const CommandResult r = run_command(s.train + " " + s.stage("packed", "best_fit", steps));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("hold no labelled token and are left out of the packing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(s.dir / "data/"), std::string::npos) << "the first left-out piece is named\n" << r.output;
  EXPECT_NE(r.output.find(" piece 1 of "), std::string::npos) << r.output;
  EXPECT_EQ(steps_without_labels(r.output), 0) << r.output;
  const std::vector<Json> m = records(s.dir / "packed/metrics.jsonl");
  ASSERT_EQ(m.size(), static_cast<size_t>(steps));
  for (const Json& j : m) {
    EXPECT_GT(j.at("labels").as_int(), 0) << j.dump();
    EXPECT_TRUE(j.find("loss") && std::isfinite(j.at("loss").as_double())) << j.dump();
  }
}

// Window packing at batch 1: steps without a labelled token are steps with no update, recorded
// and counted; then kill -9 loops end with the uninterrupted run's state, bit for bit.
TEST(SftFaults, WindowStepsWithoutLabelsAndKillLoops) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  Sft s;
  s.make_data(rng, 30);
  if (HasFatalFailure()) return;
  const int64_t steps = 16;
  const std::string stage = s.stage("straight", "window", steps);
  const CommandResult r = run_command(s.train + " " + stage);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("windows per epoch hold no labelled token"), std::string::npos) << r.output;
  const std::vector<Json> m = records(s.dir / "straight/metrics.jsonl");
  ASSERT_EQ(m.size(), static_cast<size_t>(steps));
  int64_t none = 0;
  for (const Json& j : m) {
    const bool no_labels = j.find("no_labels") && j.at("no_labels").as_bool();
    EXPECT_EQ(no_labels, j.at("labels").as_int() == 0) << j.dump();
    EXPECT_EQ(j.find("loss") != nullptr, !no_labels) << "a step without labels has no loss, not 0 or NaN: " << j.dump();
    EXPECT_EQ(j.find("grad_norm") != nullptr, !no_labels) << j.dump();
    if (!no_labels) continue;
    ++none;
    const std::string step = std::to_string(j.at("step").as_int());
    EXPECT_NE(r.output.find("step " + step + "/" + std::to_string(steps) + " | no labelled token: no update"),
              std::string::npos)
        << r.output;
    if (none <= 10) {  // (the first ten of a process are described)
      EXPECT_NE(
          r.output.find("step " + step + "/" + std::to_string(steps) + ": the global batch has no labelled token"),
          std::string::npos)
          << r.output;
    }
  }
  std::printf("%lld of %lld steps without a labelled token (seq_length %lld)\n", static_cast<long long>(none),
              static_cast<long long>(steps), static_cast<long long>(s.L));
  EXPECT_EQ(steps_without_labels(r.output), none) << r.output;
  if (none > 0) { EXPECT_NE(r.output.find("window of stream tokens ["), std::string::npos) << r.output; }

  // kill -9 after the record of three random steps, each resumed with --resume auto.
  const std::string killed = s.stage("killed", "window", steps);
  std::set<int64_t> at;
  while (at.size() < 3) at.insert(1 + static_cast<int64_t>(rng() % (steps - 1)));
  for (int64_t k : at) {
    const CommandResult c =
        run_command("EASYCTX_FAULT=recorded@" + std::to_string(k) + ":0:kill " + s.train + " " + killed);
    EXPECT_NE(c.status, 0) << "not killed at step " << k << "\n" << c.output;
  }
  for (int i = 0; i < 3 && !fs::exists(s.dir / "killed/DONE"); ++i) {
    const CommandResult c = run_command(s.train + " " + killed);
    ASSERT_EQ(c.status, 0) << c.output;
  }
  ASSERT_TRUE(fs::exists(s.dir / "killed/DONE"));
  EXPECT_EQ(easyctx::test::read_text(s.dir / "killed/final/model.safetensors"),
            easyctx::test::read_text(s.dir / "straight/final/model.safetensors"))
      << "the final weights differ from the uninterrupted run's (kills after steps " << *at.begin() << ", ...)";
  EXPECT_EQ(metrics_of(s.dir / "killed"), metrics_of(s.dir / "straight"));
}
