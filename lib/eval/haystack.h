// The needle's haystack: token ids of text read in order and repeated from the start until
// there are enough (EasyContext concatenates its essays and repeats them the same way).
//
//   ""              the King James Bible, read through `bible` of Debian's bible-kjv (which
//                   scripts/setup.sh installs), one verse per line: public domain, ~1M tokens
//   a folder        its files, walked recursively in path order: *.txt (the whole file is a
//                   document), *.jsonl / *.json / *.jsonl.zst / *.zst (JSON Lines with a
//                   "text" field), *.h5 (h5tokenize shards: their ids as stored, which must
//                   come from the same tokenizer file); other files are skipped
//   a file          one of those
// Text is tokenized in pieces of about 64 KiB cut after a newline, in parallel; BOS and EOS
// ids are removed (the prompt has its own BOS).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenize/tokenizer.h"
#include "dist/comm.h"

namespace easyctx::eval {

struct Haystack {
  std::vector<uint32_t> tokens;  // at least the min_tokens asked for
  std::string description;       // what was read, for the log
};

// Throws InputError naming --haystack-dir, the file or the missing program.
Haystack load_haystack(const std::string& spec, const data::Tokenizer& tok, int64_t min_tokens);

// Training text (h5synth's --text-dir, a folder or file of the same forms): all of it up to about
// `max_tokens` (a larger text is cut there), repeated from the start only when shorter than
// `min_tokens`. Errors name --text-dir; check_text_source makes its checks before reading.
Haystack load_text(const std::string& spec, const data::Tokenizer& tok, int64_t max_tokens, int64_t min_tokens);
void check_text_source(const std::string& spec);

// The same as load_haystack, collective over `comm` (a host communicator; every rank calls it with the same
// arguments): rank `root` alone reads and tokenizes (the KJV through `bible`, or the folder),
// then broadcasts the token ids and the description, so every rank holds what load_haystack
// would have returned on it, at the cost of one read. When rank `root` fails, every rank throws
// the same message as the same type (InputError for bad input), so a job ends alike everywhere.
Haystack load_haystack(const std::string& spec, const data::Tokenizer& tok, int64_t min_tokens, dist::Comm& comm,
                       int root = 0);

// The default haystack's text (verse texts, one per line), or "" when `bible` is missing.
std::string kjv_text();

// The checks load_haystack makes before reading (the folder or file is there and holds
// haystack files; without a spec, `bible` answers): InputError naming --haystack-dir. Cheap,
// for programs to call first, on the rank that will read the haystack.
void check_haystack_source(const std::string& spec);

}  // namespace easyctx::eval
