// bench_window_pairs: the attention work of every sequence of one epoch of a shard, as the
// loader builds it with data.document_mask (packed documents, positions restarting, padding
// cut into documents of at most kPaddingDocument tokens), in the order of epoch 0's samples:
// per sequence its labels, documents (padding's included) and the query-key pairs it
// computes over a causal window's (attention::visible_pairs; metrics.jsonl's attention_share for the step
// that trains it). A count on the CPU, no timing: how packing and padding shape the step.
//   bench_window_pairs --data SHARDS --seq-length 131072 [--packing best_fit|one_per_window]
//                      [--pack-pool 4096]
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "attention/documents.h"
#include "core/error.h"
#include "data/loader.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {

// The loader's options from the command line; false after --help.
bool parse(int argc, char** argv, data::LoaderOptions& o) {
  po::options_description desc("bench_window_pairs options");
  std::string packing = "best_fit";
  desc.add_options()("help", "this text")("data", po::value(&o.path)->required(), "shard file, folder or glob")(
      "seq-length", po::value(&o.seq_length)->required(), "tokens per sequence (data.seq_length)")(
      "packing", po::value(&packing)->default_value(packing), "best_fit or one_per_window (data.packing)")(
      "pack-pool", po::value(&o.pack_pool)->default_value(o.pack_pool), "documents per best-fit pool");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return false;
  }
  po::notify(vm);
  if (packing == "best_fit") o.packing = DataPacking::BestFit;
  else if (packing == "one_per_window") o.packing = DataPacking::OnePerWindow;
  else throw InputError("--packing: expected best_fit or one_per_window, got '" + packing + "'");
  o.document_mask = true;
  o.check_tokens = false;
  o.shape = {1, 1, 1};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    data::LoaderOptions o;
    if (!parse(argc, argv, o)) return 0;
    data::DataLoader l(o);
    const int64_t L = o.seq_length;
    const double square = static_cast<double>(L) * static_cast<double>(L + 1) / 2;
    std::printf("sample  labels  documents  pairs_over_causal\n");
    for (uint64_t i = 0; i < l.sequences_per_epoch(); ++i) {
      const data::SpSequence q = l.sequence(i);
      int64_t labels = 0;
      for (int32_t x : q.labels) labels += x >= 0;
      std::printf("%6llu  %6lld  %9zu  %17.4f\n", static_cast<unsigned long long>(i), static_cast<long long>(labels),
                  q.doc_starts.size(), static_cast<double>(attention::visible_pairs(q.doc_starts, 0, L, 0)) / square);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_window_pairs: error: %s\n", e.what());
    return 1;
  }
}
