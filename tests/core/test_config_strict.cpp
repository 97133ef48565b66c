// Strict stage-config inputs: a folder given where a file is expected is an error naming it
// (it used to read as an empty config, i.e. every default).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "test_util.h"

using easyctx::test::input_error_of;

using namespace easyctx;
namespace fs = std::filesystem;

TEST(ConfigStrict, FolderAsStageYamlNamesTheFolder) {
  const fs::path dir = fs::temp_directory_path() / ("easyctx-stage-dir-" + std::to_string(test::test_seed() % 1000003));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string e = input_error_of([&] { load_stage_config(dir.string()); });
  EXPECT_NE(e.find(dir.string() + ": is a folder; the stage config is one YAML file (this folder holds none)"),
            std::string::npos)
      << e;
  std::ofstream(dir / "s2.yaml") << "train:\n  steps: 1\n";
  std::ofstream(dir / "s1.yaml") << "train:\n  steps: 1\n";
  e = input_error_of([&] { load_stage_config(dir.string(), {"train.steps=3"}); });
  EXPECT_NE(e.find("(this folder holds s1.yaml, s2.yaml)"), std::string::npos) << e;
  EXPECT_EQ(load_stage_config((dir / "s1.yaml").string()).train.steps, 1);
  // Every reader of a file says so too (config.json, tokenizer.json, index.json...).
  e = input_error_of([&] { read_file(dir.string()); });
  EXPECT_NE(e.find(dir.string() + ": is a folder, expected a file"), std::string::npos) << e;
  fs::remove_all(dir);
}
