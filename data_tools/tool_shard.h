// What the tools that build documents and write them as one token shard (h5synth, h5recall) do
// the same way (header-only: each tool is one program built from its own .cpp).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "data/shard.h"
#include "data/tokenize/tokenizer.h"

namespace easyctx::data_tools {

// Creates the folder `output` and output/tokenizer/ with the tokenizer file copied in (as
// h5tokenize keeps it); returns the shard's header for documents of `tok`'s ids that start
// with BOS (when it has one) and have no EOS. Loss weights are the caller's to switch on.
inline data::ShardMeta prepare_shard_output(const std::string& output, const std::string& tokenizer,
                                            const data::Tokenizer& tok) {
  namespace fs = std::filesystem;
  fs::create_directories(output);
  fs::create_directories(fs::path(output) / "tokenizer");
  fs::copy_file(tokenizer,
                fs::path(output) / "tokenizer" / (tok.kind() == "hf-bpe" ? "tokenizer.json" : "tokenizer.model"),
                fs::copy_options::overwrite_existing);
  data::ShardMeta meta;
  meta.tokenizer_name = fs::path(tokenizer).filename().string();
  meta.tokenizer_sha256 = tok.sha256();
  meta.vocab_size = tok.vocab_size();
  meta.bos_id = tok.bos_id();
  meta.eos_id = tok.eos_id();
  meta.add_bos = tok.bos_id() >= 0;
  meta.add_eos = false;
  return meta;
}

// Items 0..n-1: built by build(i) in parallel, in batches of 256, each batch then handed to
// write(item) in order, so that what is written does not depend on the thread count. An
// exception from build is rethrown after its batch (one may not leave an OpenMP region).
template <typename Item, typename Build, typename Write>
void build_in_order(int64_t n, const Build& build, const Write& write) {
  const int64_t batch = 256;
  std::vector<Item> buf(static_cast<size_t>(batch));
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t m = std::min(batch, n - first);
    std::exception_ptr failed;
#pragma omp parallel for schedule(dynamic)
    for (int64_t j = 0; j < m; ++j) {
      try {
        buf[static_cast<size_t>(j)] = build(static_cast<uint64_t>(first + j));
      } catch (...) {
#pragma omp critical
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    for (int64_t j = 0; j < m; ++j) write(buf[static_cast<size_t>(j)]);
  }
}

}  // namespace easyctx::data_tools
