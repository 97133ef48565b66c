// Faults around h5tokenize, each a class rather than one example (docs/reliability.md,
// "h5tokenize"): a full file system (a private tmpfs in a private mount namespace), a
// file-size limit with SIGXFSZ at its default (`ulimit -f`, as a batch system sets it), kill -9
// at random points of a chat run then resumes, a read-only output folder, inputs that were read
// wrongly or dropped with exit 0 (a cut-off first record, byte-order marks, a wrong format,
// too many malformed records, files a folder walk leaves out), a foreign tokenizer.json, and
// records too large for the tokenizer's memory under a memory cap.
//
// Every case runs the h5tokenize program through bash, as a user or a batch script would, and
// checks: the exit status (non-zero and no signal on a fault), the message (the file, the
// cause, the remedy), that every finished shard is valid, and that a rerun ends with the same
// shards and summary counts as an uninterrupted run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <regex>

#include "core/json.h"
#include "core/strings.h"
#include "data/shard.h"
#include "data/tokenize/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

std::string bin(const std::string& name) { return easyctx::test::bin_dir() + "/" + name; }

// Single-quoted for bash.
std::string q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Shell {
  int rc = -1;         // the status `rc=N` the script printed last (h5tokenize's), else bash's
  std::string output;  // stdout + stderr
};

// Runs `script` under bash; the script prints `rc=$?` after the command whose status counts.
Shell bash(const std::string& script) {
  const auto r = easyctx::test::run_command("bash -c " + q(script));
  Shell s;
  s.output = r.output;
  s.rc = r.status;
  static const std::regex re("rc=([0-9]+)");
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), re); it != std::sregex_iterator(); ++it)
    s.rc = std::stoi((*it)[1]);
  return s;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A private mount namespace: `unshare -m` as root (CI), else a user namespace as well.
std::string unshare_cmd() {
  static const std::string cmd = [] {
    for (const char* c : {"unshare -m", "unshare -rm"})
      if (bash(std::string(c) + " true").rc == 0) return std::string(c);
    return std::string();
  }();
  return cmd;
}

// The chat tokenizer of these tests: byte-level, ChatML specials, a tokenizer_config.json
// naming the ChatML template (so --chat-template auto works). Written into dir/tok/.
std::string write_tokenizer(const ScratchDir& dir) {
  fs::create_directories(dir / "tok");
  easyctx::test::write_text(dir / "tok/tokenizer.json", easyctx::test::chatml_byte_tokenizer_json());
  easyctx::test::write_text(dir / "tok/tokenizer_config.json",
                            "{\"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content "
                            "}}<|im_end|>\\n{% endfor %}\"}\n");
  return dir / "tok/tokenizer.json";
}

std::string random_words(std::mt19937_64& rng, size_t n) {
  static const char* const w[] = {"the",  "river", "ran",  "under", "a", "stone",  "bridge", "and", "nine", "birds",
                                  "sang", "über",  "café", "42",    "x", "Привет", "日本",   "!",   "?",    "—"};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[rng() % std::size(w)];
  return s;
}

std::string chat_line(std::mt19937_64& rng, size_t answer_words) {
  Json m = Json::array();
  if (rng() % 4 == 0) m.push_back(Json::object({{"role", "system"}, {"content", random_words(rng, 5)}}));
  m.push_back(Json::object({{"role", "user"}, {"content", random_words(rng, 3 + rng() % 30)}}));
  m.push_back(Json::object({{"role", "assistant"}, {"content", random_words(rng, answer_words)}}));
  return Json::object({{"messages", m}}).dump() + "\n";
}

// n chat records in `files` files (of at least 200 records each: one malformed record in each
// file, below the 1% a run may skip; a blank line here and there), the first file starting
// with a byte-order mark. Returns the paths.
std::vector<std::string> write_chat_corpus(const ScratchDir& dir, std::mt19937_64& rng, int n, int files,
                                           const std::string& prefix = "chat") {
  std::vector<std::string> paths;
  for (int f = 0; f < files; ++f) {
    std::string text = f == 0 ? "\xEF\xBB\xBF" : "";
    const int bad = static_cast<int>(rng() % static_cast<uint64_t>(n / files));
    for (int i = 0; i < n / files; ++i) {
      if (i == bad) text += "{\"messages\": [{\"role\": \"user\"}]}\n";
      else if (rng() % 200 == 0) text += "\n";
      else text += chat_line(rng, 10 + rng() % 200);
    }
    paths.push_back(dir / (prefix + std::to_string(f) + ".jsonl"));
    easyctx::test::write_text(paths.back(), text);
  }
  return paths;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += " " + q(x);
  return s;
}

struct ShardData {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> weights;
  std::vector<std::string> sources;
  bool operator==(const ShardData& o) const {
    return tokens == o.tokens && offsets == o.offsets && weights == o.weights && sources == o.sources;
  }
};

// Every shard of an output folder, opened and checked by the reader; no temporaries left.
std::map<std::string, ShardData> shards(const std::string& dir) {
  std::map<std::string, ShardData> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_FALSE(ends_with(name, ".tmp")) << "a temporary file was left: " << e.path();
    if (!ends_with(name, ".h5")) continue;
    TokenShardReader r(e.path().string());
    ShardData d;
    d.tokens = r.read(0, r.num_tokens());
    d.offsets = r.doc_offsets();
    d.weights.resize(r.num_tokens());
    r.read_weights(0, r.num_tokens(), d.weights.data());
    d.sources = r.sources();
    out[name] = std::move(d);
  }
  return out;
}

// The counts of a summary file that must not depend on how the run was interrupted.
Json summary_counts(const std::string& dir) {
  Json s = parse_json(easyctx::test::read_text(dir + "/h5tokenize_summary.json"), dir);
  Json out = Json::object();
  for (const char* k : {"sources", "length_histogram", "records", "blank", "malformed", "empty", "byte_order_marks",
                        "skipped_files", "docs", "tokens", "shards", "forced_cuts"})
    out.set(k, s.at(k));
  return out;
}

// The finished output of `cmd` (an h5tokenize command line without -o) in dir/name, run
// without faults: the reference a faulted and resumed run must equal.
std::string reference(const ScratchDir& dir, const std::string& name, const std::string& cmd) {
  const Shell r = bash(cmd + " -o " + q(dir / name) + "; echo rc=$?");
  EXPECT_EQ(r.rc, 0) << r.output;
  return dir / name;
}

void expect_same_output(const std::string& got, const std::string& want, const std::string& what) {
  const auto a = shards(got), b = shards(want);
  EXPECT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, d] : b) {
    auto it = a.find(name);
    ASSERT_NE(it, a.end()) << what << ": " << name << " missing";
    EXPECT_TRUE(it->second == d) << what << ": " << name << " differs";
  }
  EXPECT_EQ(summary_counts(got).dump(), summary_counts(want).dump()) << what << ": the summary counts differ";
}

}  // namespace

// A tmpfs too small for the output: h5tokenize ends with an error naming the shard, ENOSPC's
// text and the remedy (no crash: the run used to die in HDF5's exit-time close, rc 139), every
// finished shard is valid and no temporary is left; on a larger file system the same command
// resumes and ends with the uninterrupted run's shards and summary.
TEST(TokenizeFaults, FullDiskEndsCleanlyAndResumes) {
  const std::string unshare = unshare_cmd();
  ASSERT_FALSE(unshare.empty()) << "needs a private mount namespace: run as root (as CI does) or allow "
                                   "unprivileged user namespaces";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokfull");
  const std::string tok = write_tokenizer(dir);
  const auto inputs = write_chat_corpus(dir, rng, 1500, 2);
  const std::string cmd =
      bin("h5tokenize") + " -t " + q(tok) + " --shard-tokens 20000 --split-bytes 300000" + join(inputs);
  const std::string want = reference(dir, "ref", cmd);
  fs::create_directories(dir / "mnt");
  const std::string mnt = dir / "mnt", keep = dir / "kept", done = dir / "done";
  const Shell r = bash(unshare + " bash -c " +
                       q("mount -t tmpfs -o size=" + std::to_string(400 + rng() % 200) + "k tmpfs " + q(mnt) + " && " +
                         cmd + " -o " + q(mnt + "/out") + "; echo rc=$?; cp -a " + q(mnt + "/out") + " " + q(keep) +
                         "; mount -o remount,size=64m " + q(mnt) + " && " + cmd + " -o " + q(mnt + "/out") +
                         " > /dev/null 2>&1; echo resumed=$?; cp -a " + q(mnt + "/out") + " " + q(done)));
  EXPECT_EQ(r.rc, 1) << "a clean error exit, no signal: " << r.output;
  EXPECT_TRUE(has(r.output, "No space left on device")) << r.output;
  EXPECT_TRUE(has(r.output, mnt + "/out/shard-")) << "names the shard: " << r.output;
  EXPECT_TRUE(has(r.output, "free space there or give another --output")) << r.output;
  EXPECT_TRUE(has(r.output, "resumes after the last finished shard")) << r.output;
  EXPECT_FALSE(has(r.output, "Segmentation fault") || has(r.output, "Signal:")) << r.output;
  const auto kept = shards(keep);  // every finished shard opens and checks; no .tmp left
  EXPECT_FALSE(kept.empty()) << "some shards fit before the disk was full: " << r.output;
  EXPECT_TRUE(has(r.output, "resumed=0")) << r.output;
  expect_same_output(done, want, "resumed after ENOSPC");
}

// `ulimit -f` with SIGXFSZ at its default, as a batch system runs a job: h5tokenize ends with
// an error naming the shard and EFBIG's text (it used to die by SIGXFSZ, rc 153, leaving a
// .tmp shard), finished shards stay valid, and a rerun without the limit finishes equal.
TEST(TokenizeFaults, FileSizeLimitEndsCleanlyAndResumes) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokfsize");
  const std::string tok = write_tokenizer(dir);
  auto inputs = write_chat_corpus(dir, rng, 800, 1);
  // One long conversation in the middle: its shard outgrows the limit the others fit in.
  std::string big;
  for (int i = 0; i < 3; ++i) big += chat_line(rng, 40000);
  easyctx::test::write_text(dir / "big.jsonl", big);
  inputs.insert(inputs.begin() + 1, dir / "big.jsonl");
  inputs.push_back(write_chat_corpus(dir, rng, 300, 1, "tail")[0]);
  const std::string cmd =
      bin("h5tokenize") + " -t " + q(tok) + " --shard-tokens 20000 --split-bytes 100000" + join(inputs);
  const std::string want = reference(dir, "ref", cmd);
  // Checked, never set: the job must see SIGXFSZ at its default (bit 25 of SigIgn).
  const Shell r = bash(
      "ulimit -f 400; ign=$(awk '/^SigIgn/ {print $2}' /proc/self/status); "
      "if (( 0x$ign & (1 << 24) )); then echo 'SIGXFSZ is ignored in the test environment'; fi; " +
      cmd + " -o " + q(dir / "out") + "; echo rc=$?");
  ASSERT_FALSE(has(r.output, "SIGXFSZ is ignored")) << "the test must run with SIGXFSZ at its default";
  EXPECT_EQ(r.rc, 1) << "a clean error exit, not SIGXFSZ (153): " << r.output;
  EXPECT_TRUE(has(r.output, "File too large")) << r.output;
  EXPECT_TRUE(has(r.output, dir / "out/shard-")) << "names the shard: " << r.output;
  EXPECT_TRUE(has(r.output, "ulimit -f")) << r.output;
  EXPECT_FALSE(shards(dir / "out").empty()) << "the shards before the long conversation were finished";
  const Shell again = bash(cmd + " -o " + q(dir / "out") + "; echo rc=$?");
  EXPECT_EQ(again.rc, 0) << again.output;
  expect_same_output(dir / "out", want, "resumed after EFBIG");
}

// kill -9 at random points of a chat run (reading, tokenizing, writing or committing a shard),
// then the same command again, until one finishes: the shards, weights and summary counts
// equal an uninterrupted run's (the summary counts the whole output, not the last part).
TEST(TokenizeFaults, KillLoopDuringChatRunEqualsUninterrupted) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokkill");
  const std::string tok = write_tokenizer(dir);
  const auto inputs = write_chat_corpus(dir, rng, 24000, 3);
  const std::string cmd = bin("h5tokenize") + " -t " + q(tok) + " --shard-tokens 50000 --split-bytes 2000000" +
                          " --threads 2" + join(inputs);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string want = reference(dir, "ref", cmd);
  const double full = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int kills = 0, runs = 0;
  for (; runs < 30; ++runs) {
    const double at = (0.05 + 0.5 * double(rng() % 1000) / 1000.0) * full;
    char delay[32];
    std::snprintf(delay, sizeof delay, "%.3f", at);
    const Shell r = bash(cmd + " -o " + q(dir / "out") + " > " + q(dir / "log") + " 2>&1 & pid=$!; sleep " + delay +
                         "; kill -9 $pid 2>/dev/null && echo killed; wait $pid; echo rc=$?");
    if (has(r.output, "killed") && r.rc == 137) {
      ++kills;
      continue;
    }
    ASSERT_EQ(r.rc, 0) << r.output << easyctx::test::read_text(dir / "log");
    break;
  }
  EXPECT_GE(kills, 2) << "the kills must land during the run (" << full << " s uninterrupted)";
  const std::string log = easyctx::test::read_text(dir / "log");
  EXPECT_TRUE(has(log, "records")) << log;
  expect_same_output(dir / "out", want, std::to_string(kills) + " kills");
}

// A chat file whose first line was cut off and which starts with a byte-order mark: read as
// chat (--format auto samples many records), the BOM removed and said, the one broken record
// skipped and named; an explicit --chat-template implies chat; --format text with a chat
// template is refused. A text file with a BOM gives the ids of the same file without one.
TEST(TokenizeFaults, CutOffFirstRecordAndByteOrderMarks) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokfirst");
  const std::string tok = write_tokenizer(dir);
  const int n = 150 + static_cast<int>(rng() % 100);
  std::string chats;
  for (int i = 0; i < n; ++i) chats += chat_line(rng, 5 + rng() % 40);
  const std::string first = chat_line(rng, 20);
  const std::string cut = first.substr(0, 10 + rng() % (first.size() / 2)) + "\n";
  easyctx::test::write_text(dir / "chat.jsonl", "\xEF\xBB\xBF" + cut + chats);
  for (const std::string& flags : {std::string(), std::string(" --chat-template chatml")}) {
    const std::string out = dir / ("out" + std::to_string(flags.size()));
    const Shell r = bash(bin("h5tokenize") + " -t " + q(tok) + flags + " -o " + q(out) + " " + q(dir / "chat.jsonl") +
                         " --max-skipped-fraction 0.01; echo rc=$?");
    EXPECT_EQ(r.rc, 0) << flags << ": " << r.output;
    EXPECT_TRUE(has(r.output, "chat records")) << flags << ": " << r.output;
    EXPECT_TRUE(has(r.output, dir / "chat.jsonl:1: a UTF-8 byte-order mark")) << r.output;
    EXPECT_TRUE(has(r.output, dir / "chat.jsonl:1: bad JSON")) << "the cut-off record is named: " << r.output;
    const Json s = parse_json(easyctx::test::read_text(out + "/h5tokenize_summary.json"), out);
    EXPECT_EQ(s.at("docs").as_int(), n) << flags;
    EXPECT_EQ(s.at("records").as_int(), n + 1) << flags;
    EXPECT_EQ(s.at("malformed").as_int(), 1) << flags;
    EXPECT_EQ(s.at("byte_order_marks").as_int(), 1) << flags;
  }
  const Shell text = bash(bin("h5tokenize") + " -t " + q(tok) + " --format text --chat-template chatml -o " +
                          q(dir / "bad") + " " + q(dir / "chat.jsonl") + "; echo rc=$?");
  EXPECT_EQ(text.rc, 2) << text.output;
  EXPECT_TRUE(has(text.output, "applies to chat records only")) << text.output;
  // Text records: the BOM is not part of the first document.
  std::string lines;
  for (int i = 0; i < 20; ++i) lines += Json::object({{"text", random_words(rng, 30)}}).dump() + "\n";
  easyctx::test::write_text(dir / "bom.jsonl", "\xEF\xBB\xBF" + lines);
  easyctx::test::write_text(dir / "plain.jsonl", lines);
  for (const char* f : {"bom", "plain"}) {
    const Shell r = bash(bin("h5tokenize") + " -t " + q(tok) + " --no-bos -o " + q(dir / (std::string("t") + f)) + " " +
                         q(dir / (std::string(f) + ".jsonl")) + "; echo rc=$?");
    EXPECT_EQ(r.rc, 0) << r.output;
  }
  const auto a = shards(dir / "tbom"), b = shards(dir / "tplain");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a.begin()->second.tokens, b.begin()->second.tokens);
}

// More than --max-skipped-fraction of the records malformed (here a wrong --text-field for a
// part of the input): the run writes its shards and summary, then fails naming the file, the
// count and the first skipped FILE:LINE with the reason; a rerun fails the same way without
// tokenizing again, and passes once the flag allows the share. A folder's files of other
// formats are named, not silently left out.
TEST(TokenizeFaults, TooManySkippedRecordsFailNamingTheFile) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokskip");
  const std::string tok = write_tokenizer(dir);
  fs::create_directories(dir / "in");
  std::string good, mixed;
  for (int i = 0; i < 300; ++i) good += Json::object({{"text", random_words(rng, 20)}}).dump() + "\n";
  const int bad_every = 5 + static_cast<int>(rng() % 10);
  int bad = 0, first_bad = 0;
  for (int i = 1; i <= 200; ++i) {
    const bool b = i % bad_every == 0;
    mixed += Json::object({{b ? "content" : "text", random_words(rng, 20)}}).dump() + "\n";
    if (b && !first_bad) first_bad = i;
    bad += b;
  }
  easyctx::test::write_text(dir / "in/a.jsonl", good);
  easyctx::test::write_text(dir / "in/b.jsonl", mixed);
  easyctx::test::write_text(dir / "in/c.jsonl.gz", "not read");
  const std::string cmd = bin("h5tokenize") + " -t " + q(tok) + " --no-bos -o " + q(dir / "out") + " " + q(dir / "in");
  const Shell r = bash(cmd + "; echo rc=$?");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_TRUE(has(r.output, std::to_string(bad) + " of 500 records")) << r.output;
  EXPECT_TRUE(has(r.output, dir / "in/b.jsonl: " + std::to_string(bad) + " skipped, first " + dir.path() +
                                "/in/b.jsonl:" + std::to_string(first_bad) + ": missing text field 'text'"))
      << r.output;
  EXPECT_TRUE(has(r.output, "--max-skipped-fraction")) << r.output;
  EXPECT_TRUE(has(r.output, "1 file(s) not read")) << r.output;
  EXPECT_TRUE(has(r.output, dir / "in/c.jsonl.gz")) << r.output;
  const auto written = shards(dir / "out");
  EXPECT_FALSE(written.empty());
  const Shell again = bash(cmd + "; echo rc=$?");
  EXPECT_EQ(again.rc, 2) << again.output;
  EXPECT_TRUE(has(again.output, "already finished")) << again.output;
  const Shell ok = bash(cmd + " --max-skipped-fraction 0.3; echo rc=$?");
  EXPECT_EQ(ok.rc, 0) << ok.output;
  const Json s = parse_json(easyctx::test::read_text(dir / "out/h5tokenize_summary.json"), "summary");
  EXPECT_EQ(s.at("docs").as_int(), 500 - bad);
  EXPECT_EQ(s.at("malformed").as_int(), bad);
}

// A read-only output folder and a tokenizer.json that is not one: each named with what is
// wrong, before any work.
TEST(TokenizeFaults, ReadOnlyOutputAndForeignTokenizerNamed) {
  const std::string unshare = unshare_cmd();
  ASSERT_FALSE(unshare.empty()) << "needs a private mount namespace: run as root (as CI does)";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokro");
  const std::string tok = write_tokenizer(dir);
  easyctx::test::write_text(dir / "a.jsonl", Json::object({{"text", random_words(rng, 10)}}).dump() + "\n");
  fs::create_directories(dir / "mnt");
  const std::string mnt = dir / "mnt";
  const Shell r = bash(unshare + " bash -c " +
                       q("mount -t tmpfs -o size=1m tmpfs " + q(mnt) + " && mkdir " + q(mnt + "/out") +
                         " && mount -o remount,ro " + q(mnt) + " && " + bin("h5tokenize") + " -t " + q(tok) +
                         " --no-bos -o " + q(mnt + "/out") + " " + q(dir / "a.jsonl") + "; echo rc=$?"));
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_TRUE(has(r.output, "the output folder " + mnt + "/out is not writable (Read-only file system)")) << r.output;
  for (const std::string& text :
       {std::string("{}"), std::string("{\"chat_template\": \"x\", \"model_max_length\": 9}"), std::string("[1, 2]")}) {
    easyctx::test::write_text(dir / "tok/bad.json", text);
    const Shell t = bash(bin("h5tokenize") + " -t " + q(dir / "tok/bad.json") + " -o " + q(dir / "o") + " " +
                         q(dir / "a.jsonl") + "; echo rc=$?");
    EXPECT_EQ(t.rc, 2) << t.output;
    EXPECT_TRUE(has(t.output, "is not a Hugging Face tokenizer.json of a supported kind")) << t.output;
    EXPECT_FALSE(has(t.output, "missing key")) << t.output;
  }
}

// Records far larger than the tokenizer's pieces under a memory cap (`ulimit -d`, as a batch
// system caps a job): a 3 MB text without a space, and 3 MB answers of a chat with and
// without spaces, with Llama 2's SentencePiece (about 100 bytes of working memory per byte it
// encodes at once: these records used to take 0.3-0.4 GB each and fail with std::bad_alloc
// under the cap). Each finishes; cuts inside a word are warned about, and the ids still
// decode to the record's text.
TEST(TokenizeFaults, HugeRecordsUnderAMemoryCap) {
  const std::string llama2 = easyctx::test::llama2_path();
  ASSERT_TRUE(fs::exists(llama2)) << llama2 << " is absent (CI has the Llama tokenizer fixtures beside the clone)";
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("tokhuge");
  static const char* const w[] = {"river", "stone", "bridge", "nine", "birds", "sang", "old", "town", "a", "x"};
  std::string spaced, unspaced;
  while (spaced.size() < (3u << 20)) spaced += std::string(w[rng() % std::size(w)]) + " ";
  while (unspaced.size() < (3u << 20)) unspaced += w[rng() % std::size(w)];
  spaced += "end";
  const auto chat = [](const std::string& answer) {
    Json m = Json::array();
    m.push_back(Json::object({{"role", "user"}, {"content", "Say it."}}));
    m.push_back(Json::object({{"role", "assistant"}, {"content", answer}}));
    return Json::object({{"messages", m}}).dump() + "\n";
  };
  struct Case {
    std::string name, record, flags, text;
    bool forced;
  };
  const Case cases[] = {{"text", Json::object({{"text", unspaced}}).dump() + "\n", "", unspaced, true},
                        {"chat-spaced", chat(spaced), " --chat-template llama2", spaced, false},
                        {"chat-unspaced", chat(unspaced), " --chat-template llama2", unspaced, true}};
  const auto tok = load_tokenizer(llama2);
  for (const Case& c : cases) {
    easyctx::test::write_text(dir / (c.name + ".jsonl"), c.record);
    const Shell r = bash("ulimit -d 250000; " + bin("h5tokenize") + " -t " + q(llama2) + c.flags + " -o " +
                         q(dir / c.name) + " " + q(dir / (c.name + ".jsonl")) + "; echo rc=$?");
    EXPECT_EQ(r.rc, 0) << c.name << ": " << r.output;
    EXPECT_EQ(has(r.output, c.name + ".jsonl:1: cut "), c.forced) << c.name << ": " << r.output;
    const auto s = shards(dir / c.name);
    ASSERT_EQ(s.size(), 1u) << c.name;
    const ShardData& d = s.begin()->second;
    ASSERT_EQ(d.offsets.size(), 2u) << c.name << ": one document";
    std::vector<uint32_t> answer;  // text: every id after BOS; chat: the weighted ids before </s>
    for (size_t i = 1; i < d.tokens.size(); ++i)
      if (c.flags.empty() || (d.weights[i] && d.tokens[i] != 2)) answer.push_back(d.tokens[i]);
    std::string text = tok->decode(answer);
    EXPECT_EQ(trim(text), c.text) << c.name << ": the ids decode to the record's text";
  }
}
