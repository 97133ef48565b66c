// The command-line parsing every data tool does the same way (header-only: each tool is one
// program built from its own .cpp).
#pragma once
#include <boost/program_options.hpp>

#include <iostream>
#include <string>

#include "core/error.h"
#include "dist/runtime.h"

namespace easyctx::data_tools {

// Parses argv into vm, every positional argument going to the option `positional`. With
// --help, rank 0 prints `opts` and it returns false; a command line boost refuses is an
// InputError naming `tool --help`.
inline bool parse_tool_flags(dist::Runtime& rt, int argc, char** argv,
                             const boost::program_options::options_description& opts, const char* positional,
                             const std::string& tool, boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  po::positional_options_description pos;
  pos.add(positional, -1);
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
    if (vm.count("help")) {
      if (rt.rank() == 0) std::cout << opts << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) { EASYCTX_THROW_INPUT(e.what(), " (see ", tool, " --help)"); }
  return true;
}

}  // namespace easyctx::data_tools
