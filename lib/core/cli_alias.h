// EasyContext's spellings of flags and mode names, accepted beside easyctx's own so that a
// command copied from EasyContext's README or train_scripts runs (docs/easycontext.md).
// easyctx's spelling stays canonical: aliases are rewritten to it before the option parser
// sees the command line, so help, errors and --print-config name one spelling.
#pragma once
#include <string>
#include <vector>

namespace easyctx {

struct FlagAlias {
  const char* alias;      // "--num_samples"
  const char* canonical;  // "--samples"
};

// argv[1..argc) with every "--alias" and "--alias=value" replaced by its canonical flag
// (values and other arguments untouched; matching is exact, after the first "--" nothing is
// rewritten). argv[0] is kept first.
std::vector<std::string> rewrite_flag_aliases(int argc, const char* const* argv, const std::vector<FlagAlias>& table);

// "(EasyContext: --num_samples)" for the help text of `canonical`, or "" when it has no alias.
std::string alias_note(const std::vector<FlagAlias>& table, const std::string& canonical);

// easyctx's name of a sequence-parallel mode given in EasyContext's spelling (zigzag_ring_attn
// -> zigzag_ring, ulysses_attn -> ulysses, dist_flash_attn -> dist_flash, usp_attn -> usp,
// data_parallel -> none); any other name is returned unchanged.
std::string canonical_sp_mode_name(const std::string& name);

// Keeps the strings' storage for an argv-style pointer array (boost::program_options and the
// other parsers take argc/argv).
struct ArgvCopy {
  std::vector<std::string> args;
  std::vector<const char*> ptrs;
  explicit ArgvCopy(std::vector<std::string> a) : args(std::move(a)) {
    for (const std::string& s : args) ptrs.push_back(s.c_str());
    ptrs.push_back(nullptr);
  }
  ArgvCopy(const ArgvCopy&) = delete;
  ArgvCopy& operator=(const ArgvCopy&) = delete;
  int argc() const { return static_cast<int>(args.size()); }
  const char* const* argv() const { return ptrs.data(); }
};

}  // namespace easyctx
