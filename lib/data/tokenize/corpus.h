// Corpus input for h5tokenize: which files, how the work is cut, and the records in them.
//
// Inputs are files, folders (walked recursively, sorted by path) and glob patterns. Formats
// by name: *.jsonl / *.json (JSON Lines), *.jsonl.zst / *.zst (zstd-compressed JSON Lines),
// *.txt (the whole file is one document). Files of other names in a folder are left out with
// a warning naming how many and the first of them.
//
// Work units (the unit of parallelism, resume and shard naming): files are taken in input
// order; a JSON Lines file larger than split_bytes is cut into byte ranges of about
// split_bytes (a line belongs to the range holding its first byte), each its own unit;
// smaller files are grouped into units of at least split_bytes in total. The plan depends
// only on the input list, the file sizes and split_bytes, never on the number of ranks.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace easyctx::data {

enum class InputFormat { Jsonl, JsonlZst, Text };
InputFormat input_format(const std::string& path);  // throws InputError for other names
std::vector<std::string> expand_inputs(const std::vector<std::string>& args);

struct InputPiece {
  std::string path;
  InputFormat format = InputFormat::Jsonl;
  uint64_t begin = 0, end = 0;  // byte range of the file (whole file for zst/txt)
};

struct WorkUnit {
  uint64_t index = 0;
  std::vector<InputPiece> pieces;
  uint64_t bytes = 0;            // sum of piece sizes (compressed size for zst)
  std::string describe() const;  // "a.jsonl[0:268435456] b.jsonl ..." for fingerprints/logs
};
std::vector<WorkUnit> plan_units(const std::vector<std::string>& files, uint64_t split_bytes);

// One record: a JSON line (without its newline) or a whole text file.
struct RawRecord {
  std::string_view data;  // valid until the next call to next()
  const std::string* file = nullptr;
  uint64_t line = 0;  // 1-based line in the file (1 for text files)
  bool is_text_file = false;
  bool bom = false;  // a UTF-8 byte-order mark began the line (or the file) and was removed
};

class UnitReader {
 public:
  // max_record_bytes: a longer record (line or .txt file) is an InputError naming the file,
  // the line and the limit, raised before more than about that much of it is held.
  explicit UnitReader(const WorkUnit& unit, uint64_t max_record_bytes = UINT64_MAX);
  ~UnitReader();
  // Next record of the unit in order; false at the end. Throws InputError naming the file
  // on read errors and on corrupt or truncated zstd streams. A UTF-8 byte-order mark at the
  // start of a line (a file's first, or files joined by cat) or of a .txt file is removed
  // (RawRecord::bom says so).
  bool next(RawRecord& r);
  uint64_t bytes_done() const;  // input bytes consumed (compressed bytes for zst)
  struct Source;                // one open input piece (defined in corpus.cpp)

 private:
  bool open_next_piece();
  const WorkUnit& unit_;
  uint64_t max_record_;
  size_t piece_ = 0;
  std::unique_ptr<Source> src_;
  uint64_t done_before_ = 0;
};

struct FieldOptions {
  std::vector<std::string> text_path{"text"};
  std::vector<std::string> source_path{"meta", "redpajama_set_name"};
  std::string default_source = "unknown";  // when the source field is absent, and for .txt
};

struct Document {
  std::string text;
  std::string source;
};

// Parses a record into doc. Returns "" on success, otherwise why the record is malformed
// (bad JSON, missing or non-string text field, invalid UTF-8).
std::string parse_record(const RawRecord& r, const FieldOptions& opts, Document& doc);

}  // namespace easyctx::data
