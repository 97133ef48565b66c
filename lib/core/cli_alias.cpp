#include "core/cli_alias.h"

namespace easyctx {

std::vector<std::string> rewrite_flag_aliases(int argc, const char* const* argv, const std::vector<FlagAlias>& table) {
  std::vector<std::string> out;
  bool after_dashes = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !after_dashes) {
      if (a == "--") {
        after_dashes = true;
      } else {
        const size_t eq = a.find('=');
        const std::string name = a.substr(0, eq);
        for (const FlagAlias& f : table)
          if (name == f.alias) {
            a = std::string(f.canonical) + (eq == std::string::npos ? std::string() : a.substr(eq));
            break;
          }
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::string alias_note(const std::vector<FlagAlias>& table, const std::string& canonical) {
  std::string names;
  for (const FlagAlias& f : table)
    if (canonical == f.canonical) names += (names.empty() ? "" : ", ") + std::string(f.alias);
  return names.empty() ? names : " (EasyContext: " + names + ")";
}

std::string canonical_sp_mode_name(const std::string& name) {
  if (name == "zigzag_ring_attn") return "zigzag_ring";
  if (name == "ulysses_attn") return "ulysses";
  if (name == "dist_flash_attn") return "dist_flash";
  if (name == "usp_attn") return "usp";
  if (name == "data_parallel") return "none";
  return name;
}

}  // namespace easyctx
