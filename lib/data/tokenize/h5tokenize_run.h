// The h5tokenize pipeline, as a library call so tools and tests share it.
//
// Work units (corpus.h) are dealt to MPI ranks round-robin (unit u -> rank u mod N). A rank
// reads each unit's records in order, decides upsampling, tokenizes batches of documents
// on `threads` OpenMP threads, and appends them in input order to shards named
//     <output>/shard-<unit:06>-<part:04>.h5
// A shard is closed once it holds >= shard_tokens tokens (a document never spans shards).
// Each finished shard stores, in its "h5tokenize" attribute (JSON), a fingerprint of the
// options and of the unit's inputs, and the resume cursor: records consumed and the
// upsampling counters. The last part of a unit has "unit_done": true (it may be empty).
// A re-run skips finished units and resumes an unfinished one after its last finished
// shard; the result is the same files as an uninterrupted run, at any rank count.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/tokenize/corpus.h"
#include "data/tokenize/upsample.h"
#include <functional>

namespace easyctx::data {

struct TokenizeOptions {
  std::string tokenizer;
  std::string output;
  std::vector<std::string> inputs;
  FieldOptions fields;
  bool add_bos = true;
  bool add_eos = false;
  UpsampleOptions upsample;
  uint64_t shard_tokens = uint64_t(1) << 27;  // 128M tokens = 512 MiB per shard
  uint64_t chunk_tokens = uint64_t(1) << 20;  // HDF5 chunk of /tokens
  int deflate = 0;
  uint64_t split_bytes = uint64_t(256) << 20;
  uint64_t batch_bytes = uint64_t(8) << 20;  // text read per parallel tokenization batch
  // Text given to the tokenizer at a time (Tokenizer::encode_pieces): bounds its working
  // memory per thread whatever the document's length; the ids are the same.
  uint64_t piece_bytes = uint64_t(256) << 10;
  // A record (JSON line or .txt file) longer than this is an error naming the file, the line
  // and the limit (--max-doc-bytes): a document takes about 7x its size in memory.
  uint64_t max_doc_bytes = uint64_t(1) << 30;
  int threads = 1;
  bool strict = false;
  bool overwrite = false;
  int progress = -1;      // 0: none; else a line every 0.5 s (terminal) or 30 s (log)
  int max_warnings = 20;  // per rank; the rest are only counted
  // Input records: "text" (a text field per record), "chat" (chat.h: messages or
  // prompt/response, rendered with a chat template, loss weights stored), or "auto" (chat when
  // the first record of the first input looks like one).
  std::string format = "auto";
  std::string chat_template = "auto";  // llama2 | llama3 | chatml | auto (tokenizer_config.json)
  bool loss_on_all = false;            // chat: weight 1 on every token, not only assistant turns
};

// Length histogram edges (tokens per document, after BOS/EOS).
inline constexpr uint64_t kHistEdges[] = {128, 512, 2048, 8192, 32768, 131072};
inline constexpr int kHistBuckets = 7;

struct TokenizeStats {
  struct PerSource {
    uint64_t docs = 0, tokens = 0;
  };
  std::map<std::string, PerSource> sources;
  uint64_t hist[kHistBuckets] = {};
  uint64_t records = 0, malformed = 0, empty = 0, dropped_short = 0, dropped_full = 0;
  uint64_t bytes = 0, units = 0, units_skipped = 0, shards = 0;
  double seconds = 0;
  std::string to_json() const;
  void merge_json(const std::string& json);
  std::string format() const;  // human summary (multi-line)
  uint64_t total_docs() const;
  uint64_t total_tokens() const;
};

// Runs on every rank of comm; returns the totals over all ranks (on every rank). Throws
// InputError naming the file (and line) on bad input, Error on I/O failures.
TokenizeStats run_h5tokenize(const TokenizeOptions& opts, MPI_Comm comm);

}  // namespace easyctx::data
