// The command-line parsing every data tool does the same way (header-only: each tool is one
// program built from its own .cpp).
#pragma once
#include <boost/program_options.hpp>

#include <iostream>
#include <string>

#include "core/error.h"
#include "dist/runtime.h"

namespace easyctx::data_tools {

// Parses argv into vm, positional arguments going to `pos`'s options (nullptr: none are
// named, and boost passes them over). With --help it prints `opts` when `print_help` and
// returns false; a command line boost refuses is an InputError naming `tool --help`.
inline bool parse_flags(int argc, char** argv, const boost::program_options::options_description& opts,
                        const boost::program_options::positional_options_description* pos, bool print_help,
                        const std::string& tool, boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(opts);
    if (pos) parser.positional(*pos);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      if (print_help) std::cout << opts << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) { EASYCTX_THROW_INPUT(e.what(), " (see ", tool, " --help)"); }
  return true;
}

// parse_flags for a tool of ranks: every positional argument goes to the option `positional`,
// and rank 0 alone prints the help.
inline bool parse_tool_flags(dist::Runtime& rt, int argc, char** argv,
                             const boost::program_options::options_description& opts, const char* positional,
                             const std::string& tool, boost::program_options::variables_map& vm) {
  boost::program_options::positional_options_description pos;
  pos.add(positional, -1);
  return parse_flags(argc, argv, opts, &pos, rt.rank() == 0, tool, vm);
}

}  // namespace easyctx::data_tools
