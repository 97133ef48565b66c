// Long-context SFT end to end on the CPU (issue 42): a generated chat JSONL set -> h5tokenize
// --format chat --chat-template chatml -> easyctx_train with data.packing best_fit and
// data.document_mask true -> the evaluation session (lib/eval/session.h, as
// easyctx_eval_needle scores answers) on held-out chats.
//
// The chats ask for the colour of a made-up name; the answer is one of six colour words,
// fixed by the name's first letter through a rule drawn per test seed. A model that ignores
// the prompt gets the answer's first token right at most as often as the commonest colour;
// the rest of the word follows from its first letter. Checked:
//  (a) assistant-token accuracy (each answer token the argmax under teacher forcing) on
//      held-out chats: the initial weights (the trainer's: init_std 0.02, seed train.seed) are
//      near 0, the fine-tuned model high, and its first answer tokens beat every prompt-blind
//      guess: it learned to read the prompt;
//  (b) the prompt carries no loss: the shard's ids and loss weights equal a hand rendering in
//      which only the answers and their <|im_end|> have weight 1, and the trainer's labelled
//      tokens (metrics.jsonl "labels") over whole epochs of packed sequences equal the number
//      of answer tokens of the generated set, not one more.
// The tokenizer is a byte-level tokenizer.json with the ChatML specials (vocab 258): no
// fixture, and every id is known.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "core/json.h"
#include "core/strings.h"
#include "data/dataset.h"
#include "data_test_util.h"
#include "dist/comm_mpi.h"
#include "eval/session.h"
#include "test_util.h"

using namespace easyctx;
using easyctx::test::CommandResult;
using easyctx::test::run_command;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kImStart = 256, kImEnd = 257;
const std::array<std::string, 6> kColours = {"red", "blue", "green", "pink", "white", "orange"};

struct Message {
  std::string role, content;
};
struct Chat {
  std::vector<Message> messages;
  bool prompt_response = false;  // written as {"system"?, "prompt", "response"}
};

// The colour of each letter a..z: a fresh rule per seed, every colour used.
std::array<int, 26> draw_rule(std::mt19937_64& rng) {
  std::array<int, 26> r;
  for (int i = 0; i < 26; ++i) r[i] = i % 6;
  std::shuffle(r.begin(), r.end(), rng);
  return r;
}

std::string draw_name(std::mt19937_64& rng) {
  std::string s(1, static_cast<char>('A' + rng() % 26));
  const int n = 2 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) s += static_cast<char>('a' + rng() % 26);
  return s;
}

// Chats about names not in `used` (added to it): some with a system turn, some with a second
// exchange (thanks -> "you are welcome."), some as prompt/response records. Only the name
// has a capital letter.
std::vector<Chat> draw_chats(std::mt19937_64& rng, const std::array<int, 26>& rule, int n,
                             std::set<std::string>& used) {
  static const char* questions[] = {"what is the colour of ", "which colour is ", "tell me the colour of ",
                                    "do you know the colour of "};
  static const char* systems[] = {"answer with one colour.", "you know the colours of everyone.",
                                  "be brief and exact."};
  std::vector<Chat> chats;
  while (static_cast<int>(chats.size()) < n) {
    Chat c;
    c.prompt_response = rng() % 5 == 0;
    if (rng() % 3 == 0) c.messages.push_back({"system", systems[rng() % 3]});
    std::string name = draw_name(rng);
    while (!used.insert(name).second) name = draw_name(rng);
    c.messages.push_back({"user", questions[rng() % 4] + name + "?"});
    c.messages.push_back({"assistant", kColours[rule[name[0] - 'A']]});
    if (!c.prompt_response && rng() % 3 == 0) {
      c.messages.push_back({"user", "thanks!"});
      c.messages.push_back({"assistant", "you are welcome."});
    }
    chats.push_back(std::move(c));
  }
  return chats;
}

std::string jsonl(const std::vector<Chat>& chats) {
  std::string out;
  for (const Chat& c : chats) {
    Json j = Json::object();
    if (c.prompt_response) {
      for (const Message& m : c.messages)
        j.set(m.role == "user" ? "prompt" : m.role == "assistant" ? "response" : "system", m.content);
    } else {
      Json ms = Json::array();
      for (const Message& m : c.messages) {
        Json o = Json::object();
        o.set("role", m.role);
        o.set("content", m.content);
        ms.push_back(o);
      }
      j.set("messages", ms);
    }
    out += j.dump() + "\n";
  }
  return out;
}

// ChatML by hand with the byte tokenizer: <|im_start|>{role}\n{content}<|im_end|>\n per
// message; weight 1 on an assistant message's bytes and its <|im_end|>, 0 elsewhere.
// `colour_at`, when given, gets the index of each colour answer's first token.
void render(const Chat& c, std::vector<uint32_t>& ids, std::vector<uint8_t>& w,
            std::vector<size_t>* colour_at = nullptr) {
  auto put = [&](uint32_t id, uint8_t weight) {
    ids.push_back(id);
    w.push_back(weight);
  };
  for (const Message& m : c.messages) {
    const uint8_t a = m.role == "assistant";
    put(kImStart, 0);
    for (unsigned char ch : m.role + "\n") put(ch, 0);
    if (a && colour_at && std::find(kColours.begin(), kColours.end(), m.content) != kColours.end())
      colour_at->push_back(ids.size());
    for (unsigned char ch : m.content) put(ch, a);
    put(kImEnd, a);
    put('\n', 0);
  }
}

// Answer tokens (weight 1 in render) of a set: what the trainer must count as labels.
int64_t answer_tokens(const std::vector<Chat>& chats) {
  int64_t n = 0;
  for (const Chat& c : chats)
    for (const Message& m : c.messages)
      if (m.role == "assistant") n += static_cast<int64_t>(m.content.size()) + 1;
  return n;
}

struct Accuracy {
  double all = 0;    // answer tokens (with <|im_end|>) that are the model's argmax
  double first = 0;  // first tokens of colour answers that are
};

// Teacher-forced argmax accuracy on the answers of `chats` through the evaluation session:
// one request per chat (positions from 0, as a document of a masked pack sees them), one
// span of length 1 per answer token.
Accuracy accuracy(const std::string& model, const std::vector<Chat>& chats) {
  dist::MpiComm self(MPI_COMM_SELF, "self", 120);
  eval::SessionOptions o;
  o.model = model;
  o.device = DeviceKind::Cpu;
  std::vector<eval::ScoreRequest> reqs;
  std::vector<std::vector<bool>> is_first;
  for (const Chat& c : chats) {
    std::vector<uint32_t> ids;
    std::vector<uint8_t> w;
    std::vector<size_t> colour_at;
    render(c, ids, w, &colour_at);
    eval::ScoreRequest r;
    r.tokens.assign(ids.begin(), ids.end());
    std::vector<bool> first;
    for (size_t p = 1; p < ids.size(); ++p)
      if (w[p]) {
        r.spans.push_back({static_cast<int64_t>(p) - 1, 1});
        first.push_back(std::find(colour_at.begin(), colour_at.end(), p) != colour_at.end());
      }
    reqs.push_back(std::move(r));
    is_first.push_back(std::move(first));
  }
  const auto scores = eval::open_session(o, self)->score_spans(reqs);
  int64_t hit = 0, total = 0, hit_first = 0, firsts = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    for (size_t s = 0; s < scores[i].size(); ++s) {
      total += 1;
      hit += scores[i][s].all_argmax;
      if (is_first[i][s]) {
        firsts += 1;
        hit_first += scores[i][s].all_argmax;
      }
    }
  return {static_cast<double>(hit) / static_cast<double>(total),
          static_cast<double>(hit_first) / static_cast<double>(firsts)};
}

// The best a prompt-blind model can do on the first answer token: the commonest colour's share.
double blind_first_accuracy(const std::vector<Chat>& chats) {
  std::array<int, 6> count{};
  int n = 0;
  for (const Chat& c : chats)
    for (const Message& m : c.messages)
      if (m.role == "assistant" && m.content != "you are welcome.") {
        count[std::find(kColours.begin(), kColours.end(), m.content) - kColours.begin()] += 1;
        n += 1;
      }
  return static_cast<double>(*std::max_element(count.begin(), count.end())) / n;
}

// The shards hold exactly the hand rendering of every chat, in input order.
void expect_shards_equal_rendering(const std::string& dir, const std::vector<Chat>& chats) {
  data::TokenDataset ds(dir);
  ASSERT_TRUE(ds.has_loss_weights());
  ASSERT_EQ(ds.num_docs(), chats.size());
  const std::vector<uint64_t>& starts = ds.doc_starts();
  for (size_t d = 0; d < chats.size(); ++d) {
    std::vector<uint32_t> ids;
    std::vector<uint8_t> w;
    render(chats[d], ids, w);
    const uint64_t len = starts[d + 1] - starts[d];
    ASSERT_EQ(len, ids.size()) << "document " << d;
    std::vector<uint32_t> got(len);
    std::vector<uint8_t> gw(len);
    ds.read(starts[d], len, got.data());
    ds.read_weights(starts[d], len, gw.data());
    ASSERT_EQ(got, ids) << "document " << d;
    ASSERT_EQ(gw, w) << "document " << d << ": only the answers and their <|im_end|> carry loss";
  }
}

std::string stage_yaml(const ScratchDir& dir, int64_t steps, int64_t batch, uint64_t seed) {
  std::ostringstream y;
  y << "model: {config: " << (dir / "model.yaml") << ", init: random}\n"
    << "data: {path: " << (dir / "data") << ", seq_length: 512, packing: best_fit, document_mask: true}\n"
    << "train: {device: cpu, steps: " << steps << ", seed: " << seed << ", batch_size: " << batch
    << ", lr: 1.0e-2, schedule: cosine, warmup_steps: 10, min_lr: 1.0e-3, weight_decay: 0.0}\n"
    << "parallel: {sequence: {size: 1}}\n"
    << "activation: {checkpoint: none}\n"
    << "output: {dir: " << (dir / "run") << ", save_every: 0}\n"
    << "logging: {every: 50, tensorboard: false}\n";
  return y.str();
}

// Sequences per epoch from the trainer's packing line ("... N sequences per epoch ...").
int64_t sequences_per_epoch(const std::string& log) {
  const size_t at = log.find(" sequences per epoch");
  if (at == std::string::npos) return -1;
  size_t b = at;
  while (b > 0 && std::isdigit(static_cast<unsigned char>(log[b - 1]))) --b;
  return b == at ? -1 : std::stoll(log.substr(b, at - b));
}

}  // namespace

TEST(SftE2E, ChatFineTuneLearnsAnswersAndPromptsCarryNoLoss) {
  const std::string h5tok = easyctx::test::bin_dir() + "/h5tokenize";
  const std::string train = easyctx::test::bin_dir() + "/easyctx_train";
  ASSERT_TRUE(fs::exists(h5tok) && fs::exists(train)) << "build h5tokenize and easyctx_train first";
  const uint64_t seed = easyctx::test::test_seed();
  std::mt19937_64 rng(seed);
  ScratchDir dir("sft-e2e");
  const std::array<int, 26> rule = draw_rule(rng);
  std::set<std::string> names;
  const std::vector<Chat> chats = draw_chats(rng, rule, 800, names);
  const std::vector<Chat> held_out = draw_chats(rng, rule, 120, names);
  easyctx::test::write_text(dir / "train.jsonl", jsonl(chats));
  easyctx::test::write_text(dir / "tok.json", easyctx::test::chatml_byte_tokenizer_json());
  CommandResult r = run_command(h5tok + " -t " + (dir / "tok.json") + " -o " + (dir / "data") +
                                " --format chat --chat-template chatml " + (dir / "train.jsonl"));
  ASSERT_EQ(r.status, 0) << r.output;
  expect_shards_equal_rendering(dir / "data", chats);
  if (HasFatalFailure()) return;

  // A 2-layer model of width 64 over the 258 ids.
  easyctx::test::write_text(dir / "model.yaml",
                            "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                            "head_dim: 16\nintermediate_size: 172\nvocab_size: 258\nmax_position_embeddings: 2048\n"
                            "rms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\n"
                            "bos_token_id: 256\neos_token_id: 257\n");
  const int64_t steps = 200, batch = 4;
  const uint64_t train_seed = rng() % 1000000;
  easyctx::test::write_text(dir / "stage.yaml", stage_yaml(dir, steps, batch, train_seed));
  r = run_command(train + " " + (dir / "stage.yaml"));
  ASSERT_EQ(r.status, 0) << r.output;

  // (b) Labels over whole epochs: every packed sequence once per epoch, so the first k steps
  // (k * batch = lcm(N, batch) sequences) hold each answer token exactly k * batch / N times.
  const int64_t n = sequences_per_epoch(r.output);
  ASSERT_GT(n, 0) << "no packing line in the trainer's log:\n" << r.output;
  const int64_t k = std::lcm(n, batch) / batch;
  ASSERT_LE(k, steps) << "the run is shorter than one whole number of epochs";
  std::istringstream metrics(easyctx::test::read_text(dir / "run/metrics.jsonl"));
  std::vector<int64_t> labels;
  std::string losses;
  for (std::string line; std::getline(metrics, line);) {
    const Json rec = parse_json(line, "metrics");
    labels.push_back(rec.at("labels").as_int());
    if (labels.size() == 1 || labels.size() % 25 == 0)
      losses += " " + std::to_string(labels.size()) + ":" + std::to_string(rec.at("loss").as_double()).substr(0, 5);
  }
  std::printf("loss by step:%s\n", losses.c_str());
  ASSERT_EQ(static_cast<int64_t>(labels.size()), steps);
  const int64_t expect = answer_tokens(chats) * (k * batch / n);
  for (int64_t b = 0; b + k <= steps; b += k)
    EXPECT_EQ(std::accumulate(labels.begin() + b, labels.begin() + b + k, int64_t{0}), expect)
        << "steps " << b + 1 << ".." << b + k << " (" << n << " sequences per epoch)";

  // (a) Accuracy on the held-out chats, before (the trainer's initial weights) and after.
  const Accuracy before = accuracy("random:" + (dir / "model.yaml") + "@" + std::to_string(train_seed), held_out);
  const Accuracy after = accuracy(dir / "run/final", held_out);
  const double blind = blind_first_accuracy(held_out);
  std::printf(
      "assistant-token accuracy on %zu held-out chats: %.3f -> %.3f; first answer token %.3f -> %.3f "
      "(prompt-blind at most %.3f)\n",
      held_out.size(), before.all, after.all, before.first, after.first, blind);
  EXPECT_LT(before.all, 0.1);
  EXPECT_GT(after.all, 0.85);
  EXPECT_GT(after.first, blind + 0.3) << "the answers' first tokens need the prompt's name";
}
