// easyctx_report RUN_DIR... [--output FILE] [--title TEXT]
// One self-contained HTML page (no scripts, nothing fetched) for a run or a chain of stages in
// chain order: loss, learning rate, tokens/s, MFU and memory per step across the stages with
// their boundaries and restarts marked, each stage's memory plan, and the evaluations found in
// the folders (perplexity curves, needle heatmaps). Logic in lib/report (run_report.h).
#include <boost/program_options.hpp>
#include <iostream>

#include "core/error.h"
#include "core/strings.h"
#include "dist/runtime.h"
#include "report/run_report.h"

namespace po = boost::program_options;
using namespace easyctx;

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    std::vector<std::string> dirs;
    std::string out, title;
    po::options_description opts("easyctx_report RUN_DIR... [options]");
    opts.add_options()("help,h", "show this help")("runs", po::value(&dirs)->multitoken()->required(),
                                                   "output folders of the stages, in chain order")(
        "output", po::value(&out)->default_value("report.html"), "the HTML file to write")(
        "title", po::value(&title)->default_value(""), "the page's title (default: the runs' names)");
    po::positional_options_description pos;
    pos.add("runs", -1);
    po::variables_map vm;
    try {
      po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
      if (vm.count("help")) {
        if (rt.rank() == 0) std::cout << opts;
        return 0;
      }
      po::notify(vm);
    } catch (const po::error& e) { EASYCTX_THROW_INPUT("command line: ", e.what(), " (see --help)"); }
    if (rt.rank() != 0) return 0;
    std::vector<report::StageRun> stages;
    for (const std::string& d : dirs) stages.push_back(report::read_stage(d));
    if (title.empty()) {
      title = "easyctx run report:";
      for (const report::StageRun& s : stages) title += " " + s.name;
    }
    write_file_atomic(out, report::render_report(stages, title));
    std::cout << "wrote " << out << " (" << stages.size() << " stage(s))\n";
    return 0;
  });
}
