#include "core/error.h"

namespace easyctx {
namespace {
std::string& label_storage() {
  static std::string label;
  return label;
}
}  // namespace

const std::string& process_label() { return label_storage(); }
void set_process_label(std::string label) { label_storage() = std::move(label); }

}  // namespace easyctx
