// Stage configuration: defaults, YAML loading, --set overrides, and the errors a user sees
// for bad configs (each must name the key, the bad value and what is allowed).
#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "test_util.h"

using namespace easyctx;

namespace {
// Returns the error message of parsing `yaml` (+ overrides), or "" if it parsed.
std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    StageConfig c = parse_stage_config(yaml, "stage.yaml", sets);
    validate_for_world(c, 4);
  } catch (const InputError& e) { return e.what(); }
  return "";
}
}  // namespace

TEST(Config, DefaultsAndTypedValues) {
  StageConfig c = parse_stage_config(
      "model:\n  init: hf:/models/llama\n  rope_theta: 5e6\n"
      "data:\n  path: data/*.h5\n  seq_length: 65536\n"
      "train:\n  steps: 1000\n  lr: 2e-5\n  schedule: cosine\n  warmup_steps: 10\n"
      "parallel:\n  sequence:\n    mode: zigzag_ring\n    size: 2\n  zero:\n    stage: 3\n    offload_optimizer: true\n"
      "activation:\n  checkpoint: attention_output\n",
      "stage.yaml");
  EXPECT_EQ(c.model.init, "hf:/models/llama");
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 5e6);
  EXPECT_EQ(c.data.seq_length, 65536);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-5);
  EXPECT_EQ(c.train.schedule, LrSchedule::Cosine);
  EXPECT_EQ(c.parallel.sequence.mode, SeqParallelMode::ZigzagRing);
  EXPECT_EQ(c.parallel.sequence.size, 2);
  EXPECT_EQ(c.parallel.zero.stage, 3);
  EXPECT_TRUE(c.parallel.zero.offload_optimizer);
  EXPECT_EQ(c.activation.checkpoint, CheckpointPolicy::AttentionOutput);
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.train.batch_size, 1);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.95);
  EXPECT_NO_THROW(validate_for_world(c, 4));
}

TEST(Config, SetOverridesWithSameValidation) {
  StageConfig c = parse_stage_config("train:\n  steps: 5\n", "s.yaml",
                                     {"train.steps=7", "parallel.sequence.mode=ulysses", "output.dir=/tmp/x y"});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.parallel.sequence.mode, SeqParallelMode::Ulysses);
  EXPECT_EQ(c.output.dir, "/tmp/x y");
  std::string e = error_of("", {"train.lr=abc"});
  EXPECT_NE(e.find("--set train.lr=abc"), std::string::npos) << e;
  EXPECT_NE(e.find("expected a number"), std::string::npos) << e;
}

TEST(Config, DumpRoundTrips) {
  std::mt19937_64 rng(test::test_seed());
  StageConfig c;
  c.train.seed = (1ull << 63) + (rng() >> 1);  // seeds use the full 64-bit range
  c.train.steps = static_cast<int64_t>(rng() % 100000);
  c.train.lr = 1e-6 * static_cast<double>(1 + rng() % 1000);
  c.data.path = "some dir/with: colon";
  c.parallel.sequence.mode = SeqParallelMode::Usp;
  c.parallel.sequence.size = 4;
  c.parallel.sequence.ulysses_size = 2;
  std::string text = dump_stage_config(c);
  StageConfig d = parse_stage_config(text, "dump");
  EXPECT_EQ(dump_stage_config(d), text);
  EXPECT_EQ(d.train.steps, c.train.steps);
  EXPECT_DOUBLE_EQ(d.train.lr, c.train.lr);
  EXPECT_EQ(d.data.path, c.data.path);
  EXPECT_EQ(d.train.seed, c.train.seed);
}

// parallel.zero.offload_optimizer: true, false or auto (the default: the memory plan chooses,
// tests/plan/test_memory_plan.cpp); offload_params / offload_grads / offload_optimizer_layers
// make auto true; the dump
// writes what was set, and reads back the same.
TEST(Config, OffloadOptimizerTakesAuto) {
  const auto parse = [](const std::string& zero) {
    return parse_stage_config("parallel:\n  zero:\n    stage: 3\n" + zero, "stage.yaml");
  };
  const auto& z0 = StageConfig().parallel.zero;
  EXPECT_TRUE(z0.offload_optimizer_auto);
  EXPECT_FALSE(z0.offload_optimizer);
  EXPECT_EQ(config_value(StageConfig(), "parallel.zero.offload_optimizer"), "auto");
  for (const auto& [text, off, aut] :
       {std::make_tuple("", false, true), std::make_tuple("    offload_optimizer: auto\n", false, true),
        std::make_tuple("    offload_optimizer: true\n", true, false),
        std::make_tuple("    offload_optimizer: false\n", false, false),
        std::make_tuple("    offload_params: true\n", true, false),
        std::make_tuple("    offload_grads: true\n", true, false)}) {
    const StageConfig c = parse(text);
    EXPECT_EQ(c.parallel.zero.offload_optimizer, off) << text;
    EXPECT_EQ(c.parallel.zero.offload_optimizer_auto, aut) << text;
    const StageConfig d = parse_stage_config(dump_stage_config(c), "dump");
    EXPECT_EQ(d.parallel.zero.offload_optimizer, off) << text;
    EXPECT_EQ(d.parallel.zero.offload_optimizer_auto, aut) << text;
    EXPECT_EQ(config_value(c, "parallel.zero.offload_optimizer"), aut ? "auto" : off ? "true" : "false") << text;
  }
  // offload_optimizer_layers (a split of stage 0's optimizer) makes auto true as well.
  const StageConfig split = parse_stage_config("parallel:\n  zero:\n    offload_optimizer_layers: 3\n", "stage.yaml");
  EXPECT_TRUE(split.parallel.zero.offload_optimizer);
  EXPECT_FALSE(split.parallel.zero.offload_optimizer_auto);
  EXPECT_EQ(split.parallel.zero.offload_optimizer_layers, 3);
  EXPECT_EQ(parse_stage_config(dump_stage_config(split), "dump").parallel.zero.offload_optimizer_layers, 3);
  StageConfig c;
  apply_override(c, "parallel.zero.offload_optimizer=false");
  EXPECT_FALSE(c.parallel.zero.offload_optimizer_auto);
  apply_override(c, "parallel.zero.offload_optimizer=auto");
  EXPECT_TRUE(c.parallel.zero.offload_optimizer_auto);
}

// activation.checkpoint: none, layer, attention_output or auto (the memory plan chooses,
// tests/plan/test_memory_plan.cpp); until resolved it reads layer; a set value turns auto off;
// the dump reads back the same; attention_output_layers is the plan's to choose under auto.
TEST(Config, CheckpointTakesAuto) {
  EXPECT_FALSE(StageConfig().activation.checkpoint_auto);
  EXPECT_EQ(config_value(StageConfig(), "activation.checkpoint"), "layer");
  for (const auto& [text, policy, aut] : {std::make_tuple("auto", CheckpointPolicy::Layer, true),
                                          std::make_tuple("layer", CheckpointPolicy::Layer, false),
                                          std::make_tuple("attention_output", CheckpointPolicy::AttentionOutput, false),
                                          std::make_tuple("none", CheckpointPolicy::None, false)}) {
    const StageConfig c = parse_stage_config(std::string("activation:\n  checkpoint: ") + text + "\n", "stage.yaml");
    EXPECT_EQ(c.activation.checkpoint, policy) << text;
    EXPECT_EQ(c.activation.checkpoint_auto, aut) << text;
    EXPECT_EQ(config_value(c, "activation.checkpoint"), text);
    const StageConfig d = parse_stage_config(dump_stage_config(c), "dump");
    EXPECT_EQ(d.activation.checkpoint, policy) << text;
    EXPECT_EQ(d.activation.checkpoint_auto, aut) << text;
  }
  StageConfig c;
  apply_override(c, "activation.checkpoint=auto");
  EXPECT_TRUE(c.activation.checkpoint_auto);
  apply_override(c, "activation.checkpoint=attention_output");
  EXPECT_FALSE(c.activation.checkpoint_auto);
  try {
    parse_stage_config("activation:\n  checkpoint: sometimes\n", "stage.yaml");
    ADD_FAILURE() << "checkpoint: sometimes was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one of none, layer, attention_output or auto"), std::string::npos)
        << e.what();
  }
  StageConfig both = parse_stage_config("activation:\n  checkpoint: auto\n  attention_output_layers: 4\n", "s.yaml");
  try {
    validate_activation(both);
    ADD_FAILURE() << "attention_output_layers with checkpoint auto was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(
        std::string(e.what()).find("s.yaml: activation.attention_output_layers: 4 with activation.checkpoint: auto"),
        std::string::npos)
        << e.what();
  }
}

struct BadConfig {
  const char* yaml;
  std::vector<std::string> must_contain;
};

TEST(Config, BadConfigsNameTheKey) {
  const std::vector<BadConfig> cases = {
      {"train:\n  lrr: 1e-4\n", {"stage.yaml:2:3", "unknown key 'train.lrr'", "did you mean 'train.lr'"}},
      {"train:\n  steps: ten\n", {"stage.yaml:2:10", "train.steps", "'ten'", "expected an integer >= 0"}},
      {"train:\n  steps: -3\n", {"train.steps", "'-3'", ">= 0"}},
      {"train:\n  lr: 0\n", {"train.lr", "'0'", "in (0.0, 1.0]"}},
      {"train:\n  beta2: 1.0\n", {"train.beta2", "'1.0'", "in [0.0, 1.0)"}},
      {"train:\n  batch_size: 2.5\n", {"train.batch_size", "'2.5'", "integer"}},
      {"parallel:\n  sequence:\n    mode: ring\n",
       {"stage.yaml:3:11", "parallel.sequence.mode", "'ring'", "zigzag_ring"}},
      {"parallel:\n  zero:\n    stage: 2\n", {"parallel.zero.stage", "'2'", "0 or 3"}},
      {"parallel:\n  zero:\n    offload_optimizer: maybe\n",
       {"parallel.zero.offload_optimizer", "true, false or auto"}},
      {"model:\n  init: gs://bucket\n", {"model.init", "'gs://bucket'", "random, hf:DIR or ckpt:DIR"}},
      {"activation:\n  checkpoint: full\n", {"activation.checkpoint", "'full'", "attention_output"}},
      {"parallel:\n  sequence:\n    size: 3\n    mode: zigzag_ring\n", {"parallel.sequence.size", "3", "world size 4"}},
      {"parallel:\n  sequence:\n    size: 2\n    mode: none\n", {"parallel.sequence.size", "mode"}},
      {"parallel:\n  zero:\n    offload_params: true\n", {"parallel.zero.offload_params", "stage = 3"}},
      {"parallel:\n  zero:\n    stage: 3\n    offload_optimizer: false\n    offload_params: true\n",
       {"parallel.zero.offload_params", "offload_optimizer = true"}},
      {"parallel:\n  zero:\n    offload_grads: true\n", {"parallel.zero.offload_grads", "stage = 3"}},
      {"parallel:\n  zero:\n    stage: 3\n    offload_optimizer: false\n    offload_grads: true\n",
       {"parallel.zero.offload_grads", "offload_optimizer = true"}},
      {"parallel:\n  zero:\n    stage: 3\n    offload_optimizer_layers: 4\n",
       {"parallel.zero.offload_optimizer_layers = 4", "stage = 0"}},
      {"parallel:\n  zero:\n    offload_optimizer: false\n    offload_optimizer_layers: 2\n",
       {"parallel.zero.offload_optimizer_layers = 2", "offload_optimizer = true"}},
      {"parallel:\n  zero:\n    offload_optimizer_layers: -1\n", {"parallel.zero.offload_optimizer_layers"}},
      {"data:\n  seq_length: [1, 2]\n", {"data.seq_length", "expected a single value"}},
      {"trian:\n  steps: 3\n", {"unknown key 'trian'", "did you mean 'train'"}},
      {"train: 5\n", {"train", "section"}},
      {"train:\n  steps: 3\n  steps: 4\n", {"stage.yaml"}},
      {"model:\n  config:\n", {"model.config", "missing value"}},
      {"logging:\n  level: loud\n", {"logging.level", "'loud'", "debug, info, warn, error"}},
  };
  for (const auto& bc : cases) {
    std::string e = error_of(bc.yaml);
    ASSERT_FALSE(e.empty()) << "expected an error for:\n" << bc.yaml;
    for (const auto& m : bc.must_contain)
      EXPECT_NE(e.find(m), std::string::npos) << "message: " << e << "\nmissing: " << m;
  }
}

TEST(Config, UnknownOverrideSuggestsKey) {
  std::string e = error_of("", {"parallel.sequence.sise=2"});
  EXPECT_NE(e.find("did you mean 'parallel.sequence.size'"), std::string::npos) << e;
  e = error_of("", {"train.steps"});
  EXPECT_NE(e.find("expected key=value"), std::string::npos) << e;
}

TEST(Config, MissingFileNamesPath) {
  try {
    load_stage_config("/nonexistent/stage.yaml");
    FAIL() << "no error";
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("/nonexistent/stage.yaml"), std::string::npos); }
}

TEST(Config, InvalidYamlGivesLine) {
  std::string e = error_of("train:\n  steps: [1,\n");
  EXPECT_NE(e.find("stage.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
}

TEST(Config, DocsAreGeneratedFromTheRegistry) {
  // docs/config.md must be exactly what `easyctx_train --config-doc` prints.
  std::string doc = read_file(test::source_dir() + "/docs/config.md");
  EXPECT_EQ(doc, config_reference_markdown()) << "regenerate: build/bin/easyctx_train --config-doc > docs/config.md";
  for (const auto& k : config_keys()) EXPECT_NE(doc.find("`" + k + "`"), std::string::npos) << k;
}

TEST(Config, EveryShippedConfigLoads) {
  // Stage configs under configs/ (not model presets) must parse and fit their intended world.
  for (const char* name : {"demo.yaml"}) {
    std::string path = test::source_dir() + "/configs/" + name;
    EXPECT_NO_THROW(load_stage_config(path)) << path;
  }
}

// The settings that change what is trained come from the registry (each key's role), not a list
// kept by hand: changing any key to another valid value changes exactly its own entry of
// training_settings when it is one (the global batch's for batch_size and grad_accum), and
// nothing when it is not. A resume names the entries that differ (tests/train/test_train_faults).
TEST(Config, TrainingSettingsComeFromTheRegistry) {
  const StageConfig base;
  const auto settings = training_settings(base, 2);
  auto value_of = [](const std::vector<std::pair<std::string, std::string>>& s, const std::string& k) {
    for (const auto& [name, v] : s)
      if (name == k) return v;
    return std::string("<absent>");
  };
  int training = 0, run = 0;
  for (const std::string& key : config_keys()) {
    const std::string now = config_value(base, key);
    // Another valid value: the other bool, a neighbouring number, another choice or string.
    std::vector<std::string> tries = {
        now == "true" ? "false" : "true", "3", "7", "0.5", "0.25", "other/path", "hf:other", "debug", "bf16"};
    try {
      StageConfig probe = base;
      apply_override(probe, key + "=__not_a_value__");
    } catch (const InputError& e) {  // "... expected one of a, b, c"
      const std::string m = e.what();
      const size_t at = m.find("one of ");
      if (at != std::string::npos)
        for (const std::string& c : split(m.substr(at + 7), ','))
          for (const std::string& choice : split(trim(c), ' '))
            if (choice != "or") tries.insert(tries.begin(), choice);
    }
    StageConfig changed = base;
    bool done = false;
    for (const std::string& t : tries) {
      StageConfig c = base;
      try {
        apply_override(c, key + "=" + t);
      } catch (const InputError&) { continue; }
      if (config_value(c, key) == now) continue;
      changed = c;
      done = true;
      break;
    }
    ASSERT_TRUE(done) << key << ": found no other valid value";
    const auto after = training_settings(changed, 2);
    ASSERT_EQ(after.size(), settings.size()) << key;
    std::vector<std::string> differ;
    for (size_t i = 0; i < after.size(); ++i)
      if (after[i] != settings[i]) differ.push_back(after[i].first);
    const bool batch = key == "train.batch_size" || key == "train.grad_accum";
    const std::string own = batch ? "global batch (batch_size x grad_accum x data-parallel)" : key;
    if (value_of(settings, own) != "<absent>") {
      EXPECT_EQ(differ, std::vector<std::string>{own}) << key;
      ++training;
    } else {
      EXPECT_TRUE(differ.empty()) << key << " changed " << join(differ, ", ");
      ++run;
    }
  }
  // What changes the training, and what only changes how a run goes (a sample of each).
  for (const char* k : {"model.config", "model.rope_theta", "data.path", "data.seq_length", "data.packing",
                        "data.long_documents", "data.document_mask", "train.steps", "train.seed", "train.lr",
                        "train.schedule", "train.weight_decay", "train.grad_clip", "train.on_nonfinite"})
    EXPECT_NE(value_of(settings, k), "<absent>") << k << " changes what is trained";
  for (const char* k :
       {"model.init", "data.check_tokens", "train.device", "train.deterministic", "parallel.sequence.mode",
        "parallel.zero.stage", "activation.checkpoint", "output.dir", "logging.every", "target.gpu"})
    EXPECT_EQ(value_of(settings, k), "<absent>") << k << " does not change what is trained";
  EXPECT_EQ(value_of(settings, "global batch (batch_size x grad_accum x data-parallel)"),
            std::to_string(base.train.batch_size * base.train.grad_accum * 2));
  EXPECT_GT(training, 15);
  EXPECT_GT(run, 30);
}
