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
// shard; the result is the same files as an uninterrupted run, at any rank count. The
// cursor also holds the unit's record counts (read, skipped, ...) up to that point, so the
// summary of a resumed run counts the whole output, as an uninterrupted run's does.
//
// A failed write (a full disk, a file-size limit) ends the run with an error naming the shard,
// the cause and the remedy; the unfinished shard's temporary file is removed (a rerun removes
// one a killed run left) and every finished shard stays valid. A run that skipped more than
// max_skipped_fraction of its records as malformed fails after writing, naming the files,
// the count and the first skipped FILE:LINE with the reason; so does every rerun of it.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
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
  // The run fails (after writing, naming the files) when more than this share of its
  // records was skipped as malformed (--max-skipped-fraction; 1: never).
  double max_skipped_fraction = 0.01;
  int threads = 1;
  bool strict = false;
  bool overwrite = false;
  int progress = -1;      // 0: none; else a line every 0.5 s (terminal) or 30 s (log)
  int max_warnings = 20;  // per rank; the rest are only counted
  // Input records: "text" (a text field per record), "chat" (chat.h: messages or
  // prompt/response, rendered with a chat template, loss weights stored), or "auto": chat when
  // a chat template is named (chat_template other than "auto") or loss_on_given, else by a
  // sample of records (detect_format).
  std::string format = "auto";
  std::string chat_template = "auto";  // llama2 | llama3 | chatml | auto (tokenizer_config.json)
  bool loss_on_all = false;            // chat: weight 1 on every token, not only assistant turns
  bool loss_on_given = false;          // --loss-on was given (it applies to chat records only)
};

// --format auto's sample: the first kFormatSampleRecords non-blank records of each of the
// first kFormatSampleFiles input files. Each is a chat record (chat.h), a text record (a JSON
// object whose text field is a string; every .txt file) or neither; the run is chat when chat
// records outnumber text records, text otherwise. Returns "chat" or "text" and sets `why`
// to the counts.
inline constexpr int kFormatSampleRecords = 64;
inline constexpr int kFormatSampleFiles = 16;
std::string detect_format(const std::vector<WorkUnit>& units, const FieldOptions& fields, uint64_t max_record_bytes,
                          std::string& why);

// Length histogram edges (tokens per document, after BOS/EOS).
inline constexpr uint64_t kHistEdges[] = {128, 512, 2048, 8192, 32768, 131072};
inline constexpr int kHistBuckets = 7;

struct TokenizeStats {
  struct PerSource {
    uint64_t docs = 0, tokens = 0;
  };
  // Records of one input file skipped as malformed: how many, and the first (in input order:
  // work unit, then line) with its reason.
  struct Skips {
    uint64_t count = 0, unit = 0, line = 0;
    std::string why;
  };
  static constexpr size_t kMaxSkipFiles = 20;  // files named; the rest are counted together
  std::map<std::string, PerSource> sources;
  uint64_t hist[kHistBuckets] = {};
  // records: non-blank lines and .txt files read; blank: blank lines (not records); empty:
  // records whose text is empty; forced_cuts: records cut inside a word (Tokenizer::encode_pieces).
  uint64_t records = 0, blank = 0, malformed = 0, empty = 0, dropped_short = 0, dropped_full = 0, boms = 0;
  uint64_t forced_cuts = 0;
  std::map<std::string, Skips> skipped_files;
  uint64_t other_skip_files = 0, other_skips = 0;  // beyond kMaxSkipFiles
  // units: finished by this run; units_skipped: finished before it. shards: in the output;
  // shards_written: by this run.
  uint64_t bytes = 0, units = 0, units_skipped = 0, shards = 0, shards_written = 0;
  double seconds = 0;
  void skip(const std::string& file, uint64_t unit, uint64_t line, const std::string& why);
  void add(const TokenizeStats& o);  // everything but seconds
  std::string to_json() const;
  void merge_json(const std::string& json);  // add() of a to_json() text
  std::string format() const;                // human summary (multi-line)
  uint64_t total_docs() const;
  uint64_t total_tokens() const;
  // The InputError text when more than `fraction` of the records were skipped as malformed,
  // else "".
  std::string skipped_error(double fraction) const;
};

// Thrown by run_h5tokenize on every rank when more than max_skipped_fraction of the records
// were skipped as malformed (TokenizeStats::skipped_error), after the shards and the summary
// file were written; `stats` holds the totals.
class SkippedRecordsError : public InputError {
 public:
  SkippedRecordsError(const std::string& msg, TokenizeStats st) : InputError(msg), stats(std::move(st)) {}
  TokenizeStats stats;
};

// Runs on every rank of comm; returns the totals over all ranks (on every rank): the whole
// output's, units finished by earlier runs included. Throws InputError naming the file (and
// line) on bad input, SkippedRecordsError (above), Error naming the shard, the cause and the
// remedy on a failed write.
TokenizeStats run_h5tokenize(const TokenizeOptions& opts, MPI_Comm comm);

}  // namespace easyctx::data
