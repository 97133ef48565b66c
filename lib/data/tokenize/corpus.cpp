#include "data/tokenize/corpus.h"

#include <glob.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/tokenize/utf8.h"

namespace easyctx::data {
namespace fs = std::filesystem;

InputFormat input_format(const std::string& path) {
  if (ends_with(path, ".jsonl.zst") || ends_with(path, ".json.zst") || ends_with(path, ".zst"))
    return InputFormat::JsonlZst;
  if (ends_with(path, ".jsonl") || ends_with(path, ".json")) return InputFormat::Jsonl;
  if (ends_with(path, ".txt")) return InputFormat::Text;
  EASYCTX_THROW_INPUT("input ", path, ": unknown format (expected .jsonl, .jsonl.zst or .txt)");
}

namespace {
bool known_format(const std::string& p) {
  return ends_with(p, ".zst") || ends_with(p, ".jsonl") || ends_with(p, ".json") || ends_with(p, ".txt");
}
}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    std::error_code ec;
    if (fs::is_directory(a, ec)) {
      std::vector<std::string> found, other;
      for (auto it = fs::recursive_directory_iterator(a, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_regular_file()) {
          const std::string p = it->path().string();
          if (known_format(p)) found.push_back(p);
          else if (it->path().filename().string()[0] != '.') other.push_back(p);  // dot files: silently
        }
      EASYCTX_CHECK_INPUT(!ec, "cannot walk input folder ", a, ": ", ec.message());
      std::sort(found.begin(), found.end());
      std::sort(other.begin(), other.end());
      if (!other.empty())
        log_warn("input folder ", a, ": ", other.size(),
                 " file(s) not read (not .jsonl, .json, .jsonl.zst, .zst or .txt), ", "first ", other[0],
                 other.size() > 1 ? (", " + other[1]) : "", other.size() > 2 ? ", ..." : "");
      EASYCTX_CHECK_INPUT(!found.empty(), "input folder ", a, " holds no .jsonl, .jsonl.zst or .txt files");
      out.insert(out.end(), found.begin(), found.end());
    } else if (a.find_first_of("*?[") != std::string::npos && !fs::exists(a, ec)) {
      glob_t g{};
      int rc = ::glob(a.c_str(), 0, nullptr, &g);
      std::vector<std::string> found;
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      EASYCTX_CHECK_INPUT(rc == 0, "input pattern ", a, " matches no file");
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      EASYCTX_CHECK_INPUT(fs::is_regular_file(a, ec), "input ", a, " does not exist or is not a file");
      out.push_back(a);
    }
  }
  for (const auto& p : out) (void)input_format(p);  // fail early on unknown names
  return out;
}

std::string WorkUnit::describe() const {
  std::string s;
  for (const auto& p : pieces) {
    if (!s.empty()) s += ' ';
    s += p.path + "[" + std::to_string(p.begin) + ":" + std::to_string(p.end) + "]";
  }
  return s;
}

std::vector<WorkUnit> plan_units(const std::vector<std::string>& files, uint64_t split_bytes) {
  EASYCTX_CHECK_INPUT(split_bytes > 0, "--split-bytes must be > 0");
  std::vector<WorkUnit> units;
  WorkUnit cur;
  auto close = [&] {
    if (cur.pieces.empty()) return;
    cur.index = units.size();
    units.push_back(std::move(cur));
    cur = WorkUnit{};
  };
  for (const std::string& f : files) {
    std::error_code ec;
    uint64_t size = fs::file_size(f, ec);
    EASYCTX_CHECK_INPUT(!ec, "cannot stat input ", f, ": ", ec.message());
    InputFormat fmt = input_format(f);
    if (fmt == InputFormat::Jsonl && size > split_bytes) {
      close();
      for (uint64_t b = 0; b < size; b += split_bytes) {
        cur.pieces.push_back({f, fmt, b, std::min(size, b + split_bytes)});
        cur.bytes = cur.pieces.back().end - b;
        close();
      }
      continue;
    }
    cur.pieces.push_back({f, fmt, 0, size});
    cur.bytes += size;
    if (cur.bytes >= split_bytes) close();
  }
  close();
  return units;
}

// ---- byte sources ---------------------------------------------------------------------
struct UnitReader::Source {
  std::string path;
  InputFormat format;
  FILE* f = nullptr;
  uint64_t pos = 0, begin = 0, end = 0;  // file offsets (compressed file for zst)
  uint64_t line = 0;                     // lines before the current one
  std::vector<char> buf;                 // decoded bytes
  size_t head = 0, tail = 0;             // unread bytes are buf[head, tail)
  bool eof = false;                      // no more decoded bytes will come
  uint64_t line_start = 0;               // offset (plain files) of buf[head]
  ZSTD_DStream* zs = nullptr;
  std::vector<char> zin;
  ZSTD_inBuffer in{nullptr, 0, 0};
  size_t zlast = 0;  // last ZSTD_decompressStream result (0: frame done)
  std::string text;  // whole file for Text inputs
  bool text_done = false;

  ~Source() {
    if (f) std::fclose(f);
    if (zs) ZSTD_freeDStream(zs);
  }
  // Appends decoded bytes to buf; returns false at end of input.
  bool fill();
};

bool UnitReader::Source::fill() {
  if (head > 0 && head == tail) head = tail = 0;
  if (head > buf.size() / 2) {  // compact
    std::memmove(buf.data(), buf.data() + head, tail - head);
    tail -= head;
    head = 0;
  }
  if (tail == buf.size()) buf.resize(buf.size() * 2);
  if (format == InputFormat::Jsonl) {
    uint64_t want = std::min<uint64_t>(buf.size() - tail, end > pos ? end - pos : 0);
    // Past `end` we still read to finish the line that started before it.
    if (want == 0) want = buf.size() - tail;
    size_t n = std::fread(buf.data() + tail, 1, want, f);
    if (n == 0) {
      EASYCTX_CHECK_INPUT(!std::ferror(f), "read error in ", path, ": ", std::strerror(errno));
      return false;
    }
    pos += n;
    tail += n;
    return true;
  }
  // zstd: decode until some output appears or the input ends.
  while (true) {
    if (in.pos == in.size) {
      size_t n = std::fread(zin.data(), 1, zin.size(), f);
      EASYCTX_CHECK_INPUT(!std::ferror(f), "read error in ", path, ": ", std::strerror(errno));
      if (n == 0) {
        EASYCTX_CHECK_INPUT(zlast == 0, path, ": truncated zstd stream (the file ends inside a frame)");
        return false;
      }
      pos += n;
      in = ZSTD_inBuffer{zin.data(), n, 0};
    }
    ZSTD_outBuffer out{buf.data() + tail, buf.size() - tail, 0};
    zlast = ZSTD_decompressStream(zs, &out, &in);
    EASYCTX_CHECK_INPUT(!ZSTD_isError(zlast), path, ": corrupt zstd stream: ", ZSTD_getErrorName(zlast));
    tail += out.pos;
    if (out.pos > 0) return true;
  }
}

UnitReader::UnitReader(const WorkUnit& unit, uint64_t max_record_bytes) : unit_(unit), max_record_(max_record_bytes) {}
UnitReader::~UnitReader() = default;

uint64_t UnitReader::bytes_done() const {
  if (!src_) return done_before_;
  return done_before_ + std::min(src_->pos, src_->end) - src_->begin;
}

bool UnitReader::open_next_piece() {
  if (src_) done_before_ += src_->end - src_->begin;
  src_.reset();
  if (piece_ >= unit_.pieces.size()) return false;
  const InputPiece& p = unit_.pieces[piece_++];
  auto s = std::make_unique<Source>();
  s->path = p.path;
  s->format = p.format;
  s->begin = s->pos = p.begin;
  s->end = p.end;
  s->f = std::fopen(p.path.c_str(), "rb");
  EASYCTX_CHECK_INPUT(s->f, "cannot open input ", p.path, ": ", std::strerror(errno));
  if (p.format == InputFormat::Text) {
    EASYCTX_CHECK_INPUT(p.end - p.begin <= max_record_, p.path, ":1: the file (one document, ", p.end - p.begin,
                        " bytes) is longer than --max-doc-bytes ", max_record_,
                        "; raise --max-doc-bytes (a document takes about 7x its size in memory) or split it");
    s->text = read_file(p.path);
    s->pos = s->end;
  } else {
    s->buf.resize(1 << 22);
    if (p.format == InputFormat::JsonlZst) {
      s->zs = ZSTD_createDStream();
      EASYCTX_CHECK(s->zs, "ZSTD_createDStream failed");
      size_t rc = ZSTD_initDStream(s->zs);
      EASYCTX_CHECK(!ZSTD_isError(rc), "ZSTD_initDStream: ", ZSTD_getErrorName(rc));
      s->zin.resize(ZSTD_DStreamInSize());
    } else if (p.begin > 0) {
      // Line numbers: count the newlines before the range. Then skip the partial line: it
      // belongs to the previous range unless byte begin-1 is a newline.
      std::vector<char> tmp(1 << 20);
      uint64_t left = p.begin - 1;
      while (left > 0) {
        size_t n = std::fread(tmp.data(), 1, std::min<uint64_t>(left, tmp.size()), s->f);
        EASYCTX_CHECK_INPUT(n > 0, "read error in ", p.path, " while seeking to byte ", p.begin);
        s->line += static_cast<uint64_t>(std::count(tmp.data(), tmp.data() + n, '\n'));
        left -= n;
      }
      int c = std::fgetc(s->f);
      EASYCTX_CHECK_INPUT(c != EOF, "read error in ", p.path, " at byte ", p.begin - 1);
      s->pos = p.begin;
      if (c == '\n') {
        ++s->line;
      } else {
        while ((c = std::fgetc(s->f)) != EOF && c != '\n') ++s->pos;
        if (c == '\n') {
          ++s->pos;
          ++s->line;
        } else s->pos = s->end;  // no newline: the range starts inside the file's last line
      }
    }
  }
  s->line_start = s->pos;
  src_ = std::move(s);
  return true;
}

namespace {
constexpr std::string_view kBom = "\xEF\xBB\xBF";  // U+FEFF in UTF-8

// Next line of a JSON Lines source (without '\n'); false at the end of its data. A line
// longer than max_bytes is an InputError naming the file and the line.
bool next_line(UnitReader::Source& s, std::string_view& line, uint64_t max_bytes);
}  // namespace

bool UnitReader::next(RawRecord& r) {
  while (true) {
    if (!src_ && !open_next_piece()) return false;
    Source& s = *src_;
    r.file = &s.path;
    if (s.format == InputFormat::Text) {
      if (s.text_done) {
        if (!open_next_piece()) return false;
        continue;
      }
      s.text_done = true;
      r.data = s.text;
      r.line = 1;
      r.is_text_file = true;
      r.bom = starts_with(r.data, kBom);
      if (r.bom) r.data.remove_prefix(3);
      return true;
    }
    // A plain range ends when the next line would start at or after `end`.
    bool in_range = s.format != InputFormat::Jsonl || s.line_start < s.end;
    if (!in_range || !next_line(s, r.data, max_record_)) {
      if (!open_next_piece()) return false;
      continue;
    }
    if (!r.data.empty() && r.data.back() == '\r') r.data.remove_suffix(1);
    r.line = ++s.line;
    r.is_text_file = false;
    r.bom = starts_with(r.data, kBom);
    if (r.bom) r.data.remove_prefix(3);
    return true;
  }
}

namespace {
bool next_line(UnitReader::Source& s, std::string_view& line, uint64_t max_bytes) {
  auto check = [&](size_t len) {
    EASYCTX_CHECK_INPUT(
        len <= max_bytes, s.path, ":", s.line + 1, ": a line longer than --max-doc-bytes ", max_bytes, " (", len,
        " bytes", len > max_bytes + 1 ? " read without a newline" : "",
        "); raise --max-doc-bytes (a document takes about 7x its size in memory) or split the document");
  };
  size_t scan = s.head;
  while (true) {
    const char* nl = static_cast<const char*>(std::memchr(s.buf.data() + scan, '\n', s.tail - scan));
    if (nl) {
      size_t len = static_cast<size_t>(nl - (s.buf.data() + s.head));
      check(len);
      line = std::string_view(s.buf.data() + s.head, len);
      s.head += len + 1;
      s.line_start += len + 1;
      return true;
    }
    check(s.tail - s.head);  // the line so far: stop before the buffer grows past the limit
    scan = s.tail;
    size_t old_head = s.head;
    if (!s.fill()) {
      if (s.head == s.tail) return false;
      line = std::string_view(s.buf.data() + s.head, s.tail - s.head);  // last line, no newline
      s.line_start += s.tail - s.head;
      s.head = s.tail;
      return true;
    }
    scan -= old_head - s.head;  // fill() may have compacted the buffer
  }
}
}  // namespace

// ---- records ----------------------------------------------------------------------------
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ".") + x;
  return s;
}
}  // namespace

std::string parse_record(const RawRecord& r, const FieldOptions& opts, Document& doc) {
  if (r.is_text_file) {
    doc.text.assign(r.data);
    doc.source = opts.default_source;
  } else {
    Json j;
    try {
      j = parse_json(r.data, *r.file + ":" + std::to_string(r.line));
    } catch (const Error& e) { return std::string("bad JSON: ") + e.what(); }
    const Json* t = j.find_path(opts.text_path);
    if (!t) return "missing text field '" + join(opts.text_path) + "'";
    if (!t->is_string()) return "text field '" + join(opts.text_path) + "' is " + t->type_name() + ", expected string";
    const Json* s = j.find_path(opts.source_path);
    doc.source = (s && s->is_string() && !s->as_string().empty()) ? s->as_string() : opts.default_source;
    // Moved out of the parsed record `j` (ours, dropped on return): no second copy of a long text.
    doc.text = std::move(const_cast<std::string&>(t->as_string()));
  }
  size_t bad = utf8_invalid_offset(doc.text);
  if (bad != kUtf8Valid) return "invalid UTF-8 in the text at byte " + std::to_string(bad);
  return "";
}

}  // namespace easyctx::data
