#include "eval/haystack.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/strings.h"
#include "data/shard.h"
#include "data/tokenize/corpus.h"

namespace easyctx::eval {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPieceBytes = 64 << 10;
constexpr size_t kBatchPieces = 8;  // pieces tokenized at once

bool is_text_file(const std::string& p) { return ends_with(p, ".txt"); }
bool is_jsonl_file(const std::string& p) {
  return ends_with(p, ".jsonl") || ends_with(p, ".json") || ends_with(p, ".jsonl.zst") || ends_with(p, ".zst");
}
bool is_shard_file(const std::string& p) { return ends_with(p, ".h5") || ends_with(p, ".hdf5"); }

// Cuts text into pieces of about kPieceBytes that end after a newline (or at the end).
void cut_pieces(const std::string& text, std::vector<std::string>& out) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + kPieceBytes);
    if (end < text.size()) {
      const size_t nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    out.push_back(text.substr(at, end - at));
    at = end;
  }
}

class Collector {
 public:
  Collector(const data::Tokenizer& tok, int64_t want) : tok_(tok), want_(want) {}
  bool full() const { return static_cast<int64_t>(tokens_.size()) >= want_; }
  void add_text(const std::string& text) {
    if (full()) return;
    cut_pieces(text, pending_);
    if (pending_bytes() >= kPieceBytes * kBatchPieces) flush();
  }
  void add_ids(const std::vector<uint32_t>& ids, int64_t bos, int64_t eos) {
    flush();
    for (uint32_t id : ids)
      if (static_cast<int64_t>(id) != bos && static_cast<int64_t>(id) != eos) tokens_.push_back(id);
  }
  // Tokenizes the pending pieces, kBatchPieces at a time in parallel, until there are enough
  // tokens (the rest is dropped: a long text is not tokenized beyond what is asked).
  void flush() {
    for (size_t at = 0; at < pending_.size() && !full(); at += kBatchPieces) {
      const size_t n = std::min(kBatchPieces, pending_.size() - at);
      std::vector<std::vector<uint32_t>> ids(n);
#pragma omp parallel for schedule(dynamic)
      for (size_t i = 0; i < n; ++i) tok_.encode(pending_[at + i], ids[i]);
      for (const auto& v : ids)
        for (uint32_t id : v)
          if (static_cast<int64_t>(id) != tok_.bos_id() && static_cast<int64_t>(id) != tok_.eos_id())
            tokens_.push_back(id);
    }
    pending_.clear();
  }
  std::vector<uint32_t>& tokens() { return tokens_; }

 private:
  size_t pending_bytes() const {
    size_t n = 0;
    for (const auto& s : pending_) n += s.size();
    return n;
  }
  const data::Tokenizer& tok_;
  int64_t want_;
  std::vector<std::string> pending_;
  std::vector<uint32_t> tokens_;
};

// `flag`: the option that named `spec`, for messages (--haystack-dir, --text-dir).
std::vector<std::string> haystack_files(const std::string& spec, const char* flag) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    for (auto it = fs::recursive_directory_iterator(spec, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const std::string p = it->path().string();
      if (it->is_regular_file() && (is_text_file(p) || is_jsonl_file(p) || is_shard_file(p))) files.push_back(p);
    }
    EASYCTX_CHECK_INPUT(!ec, flag, " ", spec, ": cannot list the folder: ", ec.message());
    std::sort(files.begin(), files.end());
    EASYCTX_CHECK_INPUT(!files.empty(), flag, " ", spec,
                        ": no .txt, .jsonl, .json, .jsonl.zst, .zst or .h5 files in the folder");
  } else {
    EASYCTX_CHECK_INPUT(fs::is_regular_file(spec, ec), flag, " ", spec, ": no such folder or file");
    EASYCTX_CHECK_INPUT(is_text_file(spec) || is_jsonl_file(spec) || is_shard_file(spec), flag, " ", spec,
                        ": expected a folder, or a .txt, .jsonl(.zst) or .h5 file");
    files.push_back(spec);
  }
  return files;
}

// Reads the files in order into c until it is full; returns the documents read.
int64_t read_files(const std::vector<std::string>& files, const data::Tokenizer& tok, Collector& c, const char* flag) {
  int64_t docs = 0;
  for (const std::string& f : files) {
    if (c.full()) break;
    if (is_shard_file(f)) {
      data::TokenShardReader r(f);
      EASYCTX_CHECK_INPUT(r.meta().tokenizer_sha256 == tok.sha256(), flag, ": ", f,
                          " was tokenized with another tokenizer (", r.meta().tokenizer_name, ", sha256 ",
                          r.meta().tokenizer_sha256.substr(0, 12), "...) than --tokenizer ", tok.path(), " (sha256 ",
                          tok.sha256().substr(0, 12), "...)");
      const auto& off = r.doc_offsets();
      for (size_t d = 0; d + 1 < off.size() && !c.full(); ++d, ++docs)
        c.add_ids(r.read(off[d], off[d + 1] - off[d]), r.meta().bos_id, r.meta().eos_id);
    } else if (is_text_file(f)) {
      c.add_text(read_file(f));
      ++docs;
    } else {
      const data::WorkUnit unit = data::plan_units({f}, ~uint64_t{0}).at(0);
      data::UnitReader reader(unit);
      data::RawRecord rec;
      data::Document doc;
      const data::FieldOptions fields;
      while (!c.full() && reader.next(rec)) {
        const std::string why = data::parse_record(rec, fields, doc);
        EASYCTX_CHECK_INPUT(why.empty(), flag, ": ", f, " line ", rec.line, ": ", why);
        c.add_text(doc.text + "\n");
        ++docs;
      }
    }
    c.flush();
  }
  c.flush();
  return docs;
}

}  // namespace

std::string kjv_text() {
  FILE* p = popen("bible -f gen1:1-rev22:21 2>/dev/null", "r");
  if (!p) return "";
  std::string raw;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) raw.append(buf, n);
  if (pclose(p) != 0) return "";
  // "Ge1:1 In the beginning ..." -> "In the beginning ..."
  std::string out;
  out.reserve(raw.size());
  for (const std::string& line : split(raw, '\n')) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(':') > sp) continue;
    out.append(line, sp + 1, std::string::npos);
    out.push_back('\n');
  }
  return out;
}

void check_haystack_source(const std::string& spec) {
  if (!spec.empty()) {
    haystack_files(spec, "--haystack-dir");
    return;
  }
  FILE* p = popen("bible -f gen1:1 2>/dev/null", "r");
  char buf[256];
  const bool ok = p && std::fread(buf, 1, sizeof buf, p) > 0;
  const bool exited = p && pclose(p) == 0;
  EASYCTX_CHECK_INPUT(ok && exited,
                      "no --haystack-dir, and the default haystack (the King James Bible through `bible -f "
                      "gen1:1-rev22:21`) is not available: install Debian's bible-kjv (scripts/setup.sh does) or "
                      "pass --haystack-dir");
}

namespace {

// Reads about `want` tokens at most (all of a smaller text), repeated to `min_tokens` at least.
Haystack load_tokens(const std::string& spec, const data::Tokenizer& tok, int64_t want, int64_t min_tokens,
                     const char* flag) {
  Collector c(tok, want);
  Haystack h;
  if (spec.empty()) {
    const std::string text = kjv_text();
    EASYCTX_CHECK_INPUT(!text.empty(),
                        "no --haystack-dir, and the default haystack (the King James Bible through `bible -f "
                        "gen1:1-rev22:21`) is not available: install Debian's bible-kjv (scripts/setup.sh does) or "
                        "pass --haystack-dir");
    c.add_text(text);
    c.flush();
    h.description = "the King James Bible (bible-kjv)";
  } else {
    const std::vector<std::string> files = haystack_files(spec, flag);
    const int64_t docs = read_files(files, tok, c, flag);
    h.description =
        spec + " (" + std::to_string(docs) + " document(s) from " + std::to_string(files.size()) + " file(s))";
  }
  std::vector<uint32_t>& t = c.tokens();
  EASYCTX_CHECK_INPUT(!t.empty(), flag, " ", spec.empty() ? std::string("(default)") : spec,
                      ": the text has no tokens");
  const size_t once = t.size();
  h.description += ", " + std::to_string(once) + " tokens";
  if (static_cast<int64_t>(once) < min_tokens) {
    t.reserve(static_cast<size_t>(min_tokens));
    for (size_t i = 0; static_cast<int64_t>(t.size()) < min_tokens; ++i) t.push_back(t[i % once]);
    h.description += ", repeated to " + std::to_string(t.size());
  }
  h.tokens = std::move(t);
  return h;
}

}  // namespace

Haystack load_haystack(const std::string& spec, const data::Tokenizer& tok, int64_t min_tokens) {
  return load_tokens(spec, tok, min_tokens, min_tokens, "--haystack-dir");
}

void check_text_source(const std::string& spec) { haystack_files(spec, "--text-dir"); }

Haystack load_text(const std::string& spec, const data::Tokenizer& tok, int64_t max_tokens, int64_t min_tokens) {
  return load_tokens(spec, tok, std::max(max_tokens, min_tokens), min_tokens, "--text-dir");
}

Haystack load_haystack(const std::string& spec, const data::Tokenizer& tok, int64_t min_tokens, dist::Comm& comm,
                       int root) {
  EASYCTX_CHECK(comm.memspace() == MemSpace::Host, "load_haystack: the communicator must be a host one, got '",
                comm.backend(), "'");
  EASYCTX_CHECK(root >= 0 && root < comm.size(), "load_haystack: root ", root, " outside the ", comm.size(),
                " rank(s) of ", comm.name());
  if (comm.size() == 1) return load_haystack(spec, tok, min_tokens);
  // Rank root's outcome, then the bytes of its description (or error message), then the ids:
  // head = {0 loaded | 1 failed | 2 failed on bad input, token count, text bytes}, 64-bit so
  // that a haystack of more than 2^31 tokens travels too (MpiComm splits large counts).
  Haystack h;
  int64_t head[3] = {0, 0, 0};
  std::string text;
  std::exception_ptr failure;
  if (comm.rank() == root) {
    try {
      h = load_haystack(spec, tok, min_tokens);
      text = h.description;
      head[1] = static_cast<int64_t>(h.tokens.size());
    } catch (const InputError& e) {
      head[0] = 2;
      text = e.what();
      failure = std::current_exception();
    } catch (const std::exception& e) {
      head[0] = 1;
      text = e.what();
      failure = std::current_exception();
    }
    head[2] = static_cast<int64_t>(text.size());
  }
  // Every rank takes part in every broadcast whatever the outcome: a failure travels as data,
  // never as a rank that stops answering.
  comm.broadcast(head, 3, root);
  text.resize(static_cast<size_t>(head[2]));
  if (!text.empty()) comm.broadcast(reinterpret_cast<uint8_t*>(text.data()), text.size(), root);
  if (head[0] != 0) {
    if (failure) std::rethrow_exception(failure);
    if (head[0] == 2) throw InputError(text);
    throw Error(text);
  }
  if (comm.rank() != root) {
    h.tokens.resize(static_cast<size_t>(head[1]));
    h.description = text;
  }
  if (!h.tokens.empty()) comm.broadcast(h.tokens.data(), h.tokens.size(), root);
  return h;
}

}  // namespace easyctx::eval
