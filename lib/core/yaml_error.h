// yaml-cpp's errors in easyctx's words, for the messages of the stage and model YAML readers.
#pragma once
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <string>

namespace easyctx {

// What went wrong, without yaml-cpp's "error at line ..." prefix (the caller names the file and
// the line): its message, except for input nested too deeply, where yaml-cpp 0.7 stops at a
// recursion limit and says "bad file" (its depth guard's message).
inline std::string yaml_error_message(const YAML::Exception& e) {
  if (const auto* d = dynamic_cast<const YAML::DeepRecursion*>(&e))
    return "nested too deeply (yaml-cpp stops at " + std::to_string(d->depth()) +
           " levels of recursion; a stage or model YAML is a few levels deep)";
  return e.msg;
}

// "FILE:LINE:COLUMN" of a yaml-cpp error (FILE alone when it has no position).
inline std::string yaml_error_place(const std::string& source, const YAML::Exception& e) {
  if (e.mark.is_null()) return source;
  return source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
}

}  // namespace easyctx
