// h5inspect: statistics and attribute check of token shards, decoding of a window of tokens
// back to text (with --tokenizer), and a check that no document decodes to a forbidden
// phrase (--forbid, with --tokenizer).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>

#include "core/error.h"
#include "core/strings.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "data/tokenize/tokenizer.h"
#include "dist/runtime.h"
#include "tool_flags.h"

namespace po = boost::program_options;
using namespace easyctx;

namespace {
void describe(const data::TokenShardReader& r, bool scan) {
  const data::ShardMeta& m = r.meta();
  std::cout << r.path() << "\n  tokens " << r.num_tokens() << ", documents " << r.num_docs() << ", mean "
            << (r.num_docs() ? double(r.num_tokens()) / r.num_docs() : 0.0) << " tokens/doc\n"
            << "  tokenizer " << m.tokenizer_name << " sha256 " << m.tokenizer_sha256 << "\n  vocab_size "
            << m.vocab_size << ", bos " << m.bos_id << (m.add_bos ? " (added)" : "") << ", eos " << m.eos_id
            << (m.add_eos ? " (added)" : "") << ", easyctx " << m.easyctx_version << "\n";
  std::map<std::string, std::pair<uint64_t, uint64_t>> per;
  for (uint64_t d = 0; d < r.num_docs(); ++d) {
    auto& p = per[r.sources()[r.doc_source()[d]]];
    ++p.first;
    p.second += r.doc_offsets()[d + 1] - r.doc_offsets()[d];
  }
  for (const auto& [s, p] : per)
    std::cout << "  source " << s << ": " << p.first << " docs, " << p.second << " tokens\n";
  if (m.has_loss_weights) {
    // Chat shards (format_version 2): how many tokens are training targets.
    uint64_t ones = 0;
    const uint64_t block = 1 << 20;
    std::vector<uint8_t> w;
    for (uint64_t off = 0; off < r.num_tokens(); off += block) {
      w.resize(std::min(block, r.num_tokens() - off));
      r.read_weights(off, w.size(), w.data());
      for (uint8_t x : w) ones += x;
    }
    std::cout << "  loss weights: " << ones << " of " << r.num_tokens() << " tokens weighted 1 ("
              << (r.num_tokens() ? 100.0 * double(ones) / double(r.num_tokens()) : 0.0) << "%)\n";
  } else {
    std::cout << "  loss weights: none (every token is a target)\n";
  }
  if (!scan) return;
  // Full scan: every id < vocab_size and, when BOS was added, every document starts with it.
  uint64_t bad = 0, max_id = 0, bos_missing = 0;
  const uint64_t block = 1 << 20;
  for (uint64_t off = 0; off < r.num_tokens(); off += block) {
    auto v = r.read(off, std::min(block, r.num_tokens() - off));
    for (uint32_t id : v) {
      max_id = std::max<uint64_t>(max_id, id);
      bad += id >= static_cast<uint64_t>(m.vocab_size);
    }
  }
  if (m.add_bos)
    for (uint64_t d = 0; d < r.num_docs(); ++d) {
      uint64_t b = r.doc_offsets()[d];
      if (b == r.doc_offsets()[d + 1] || r.read(b, 1)[0] != static_cast<uint32_t>(m.bos_id)) ++bos_missing;
    }
  std::cout << "  scan: max id " << max_id << ", ids >= vocab " << bad << ", documents without BOS " << bos_missing
            << (bad || bos_missing ? "  FAIL" : "  OK") << "\n";
  EASYCTX_CHECK_INPUT(bad == 0 && bos_missing == 0, r.path(), ": shard check failed");
}

// The stream tokens --doc N or --decode-window START:LEN name: [start, start + len).
std::pair<uint64_t, uint64_t> decode_range(const data::TokenDataset& ds, const po::variables_map& vm,
                                           const std::string& window) {
  uint64_t start = 0, len = 0;
  if (vm.count("doc")) {
    data::TokenShardReader r(ds.file(0));
    int64_t d = vm["doc"].as<int64_t>();
    EASYCTX_CHECK_INPUT(d >= 0 && static_cast<uint64_t>(d) < r.num_docs(), "--doc ", d, " outside [0, ", r.num_docs(),
                        ")");
    start = r.doc_offsets()[d];
    len = r.doc_offsets()[d + 1] - start;
  } else {
    auto parts = split(window, ':');
    EASYCTX_CHECK_INPUT(parts.size() == 2, "--decode-window ", window, ": expected START:LEN");
    for (const std::string& part : parts)
      EASYCTX_CHECK_INPUT(
          !part.empty() && part.size() <= 19 && part.find_first_not_of("0123456789") == std::string::npos,
          "--decode-window ", window, ": expected START:LEN, two non-negative integers");
    start = std::stoull(parts[0]);
    len = std::stoull(parts[1]);
    EASYCTX_CHECK_INPUT(start < ds.num_tokens(), "--decode-window start ", start, " >= ", ds.num_tokens(), " tokens");
    len = std::min(len, ds.num_tokens() - start);
  }
  return {start, len};
}

// The loss weights of the decoded tokens (with --ids) and the trained text: runs of weight-1
// tokens, decoded, one per line.
void print_weights(const data::TokenDataset& ds, const data::Tokenizer& tok, const std::vector<uint32_t>& ids,
                   uint64_t start, bool with_ids) {
  const uint64_t len = ids.size();
  std::vector<uint8_t> w(len);
  ds.read_weights(start, len, w.data());
  if (with_ids) {
    std::cout << "loss weights: ";
    for (uint8_t x : w) std::cout << int(x) << ' ';
    std::cout << "\n";
  }
  std::cout << "weighted spans:\n";
  for (uint64_t i = 0; i < len;) {
    if (!w[i]) {
      ++i;
      continue;
    }
    uint64_t j = i;
    while (j < len && w[j]) ++j;
    std::cout << "  [" << i << ", " << j << ") " << tok.decode(ids.data() + i, j - i) << "\n";
    i = j;
  }
}

// Lower case with every run of whitespace one space: what --forbid compares.
std::string fold(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// --forbid: every document of every shard decoded (its token ids, as the trainer reads them)
// and searched for each phrase, case and whitespace runs ignored. A find is an InputError
// naming the phrase, the file, the document and its first token's offset.
void check_forbidden(const std::vector<std::string>& paths, const data::Tokenizer& tok,
                     const std::vector<std::string>& phrases) {
  std::vector<std::string> folded;
  for (const std::string& p : phrases) {
    folded.push_back(fold(p));
    EASYCTX_CHECK_INPUT(!folded.back().empty() && folded.back() != " ", "--forbid: an empty phrase");
  }
  uint64_t tokens = 0, docs = 0;
  for (const std::string& path : paths) {
    data::TokenShardReader r(path);
    EASYCTX_CHECK_INPUT(tok.sha256() == r.meta().tokenizer_sha256, path, " was made with tokenizer sha256 ",
                        r.meta().tokenizer_sha256, ", not the --tokenizer's ", tok.sha256());
    // Batches of documents read in order (HDF5 reads are serial), decoded and searched on
    // every thread; the first document of a batch that holds a phrase is the one named.
    for (uint64_t first = 0; first < r.num_docs();) {
      std::vector<std::vector<uint32_t>> batch;
      uint64_t n = 0;
      for (; first + batch.size() < r.num_docs() && (batch.empty() || n < (uint64_t{4} << 20));) {
        const uint64_t d = first + batch.size(), b = r.doc_offsets()[d];
        batch.push_back(r.read(b, r.doc_offsets()[d + 1] - b));
        n += batch.back().size();
      }
      std::vector<int> hit(batch.size(), -1);
#pragma omp parallel for schedule(dynamic)
      for (int64_t j = 0; j < static_cast<int64_t>(batch.size()); ++j) {
        const std::string text = fold(tok.decode(batch[static_cast<size_t>(j)]));
        for (size_t k = 0; k < folded.size() && hit[static_cast<size_t>(j)] < 0; ++k)
          if (text.find(folded[k]) != std::string::npos) hit[static_cast<size_t>(j)] = static_cast<int>(k);
      }
      for (size_t j = 0; j < batch.size(); ++j)
        EASYCTX_CHECK_INPUT(hit[j] < 0, "--forbid '", phrases[static_cast<size_t>(std::max(hit[j], 0))], "': ", path,
                            " holds it in document ", first + j, " (tokens from ", r.doc_offsets()[first + j], ")");
      first += batch.size();
      tokens += n;
      docs += batch.size();
    }
  }
  std::cout << "forbidden phrases: none of " << phrases.size() << " in " << tokens << " tokens of " << docs
            << " documents (decoded)\n";
}

int inspect_main(dist::Runtime& rt, int argc, char** argv) {
  std::vector<std::string> files, forbid;
  std::string window, tokenizer;
  po::options_description opts("h5inspect FILE|DIR|GLOB... [--decode-window START:LEN --tokenizer MODEL]\noptions");
  opts.add_options()("help,h", "show this help")("decode-window", po::value(&window),
                                                 "decode stream tokens [START, START+LEN) of the dataset")(
      "doc", po::value<int64_t>(), "decode document N of the first file instead")(
      "tokenizer,t", po::value(&tokenizer), "tokenizer for decoding (checked against the shard's sha256)")(
      "scan", "read every token: ids < vocab_size, BOS at each document start")(
      "ids", "also print the ids of the decoded window (and their loss weights, when the shards have them)")(
      "forbid", po::value(&forbid)->composing(),
      "a phrase no document may decode to (case and whitespace runs ignored; repeatable; needs --tokenizer): "
      "exit 2 naming the file, document and offset of the first that does")("file", po::value(&files)->composing(),
                                                                            "shard files");
  po::variables_map vm;
  if (!data_tools::parse_tool_flags(rt, argc, argv, opts, "file", "h5inspect", vm)) return 0;
  EASYCTX_CHECK_INPUT(!files.empty(), "no shard files given (see h5inspect --help)");
  std::vector<std::string> paths;
  for (const auto& f : files)
    for (const auto& p : data::TokenDataset::resolve(f)) paths.push_back(p);
  uint64_t tokens = 0, docs = 0;
  for (const auto& p : paths) {
    data::TokenShardReader r(p);
    describe(r, vm.count("scan") > 0);
    tokens += r.num_tokens();
    docs += r.num_docs();
  }
  std::cout << "total: " << paths.size() << " file(s), " << tokens << " tokens, " << docs << " documents\n";
  if (!forbid.empty()) {
    EASYCTX_CHECK_INPUT(!tokenizer.empty(), "--forbid needs --tokenizer");
    check_forbidden(paths, *data::load_tokenizer(tokenizer), forbid);
  }
  if (window.empty() && !vm.count("doc")) return 0;
  EASYCTX_CHECK_INPUT(!tokenizer.empty(), "--decode-window/--doc need --tokenizer");
  auto tok = data::load_tokenizer(tokenizer);
  data::TokenDataset ds(files.size() == 1 ? files[0] : paths[0]);
  EASYCTX_CHECK_INPUT(tok->sha256() == ds.meta().tokenizer_sha256, tokenizer, " has sha256 ", tok->sha256(),
                      " but the shards were made with ", ds.meta().tokenizer_sha256);
  const auto [start, len] = decode_range(ds, vm, window);
  std::vector<uint32_t> ids(len);
  ds.read(start, len, ids.data());
  if (vm.count("ids")) {
    for (uint32_t id : ids) std::cout << id << ' ';
    std::cout << "\n";
  }
  std::cout << tok->decode(ids) << "\n";
  if (ds.has_loss_weights()) print_weights(ds, *tok, ids, start, vm.count("ids") > 0);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) { return inspect_main(rt, argc, argv); });
}
