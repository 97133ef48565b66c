// Chat / instruction records for h5tokenize: parsing, the three chat templates, and per-token
// loss weights (docs/data.md, "Chat data").
//
// A record is a JSON object with either
//   "messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]
// or "prompt" and "response" strings (optionally "system"), read as a system, user and
// assistant turn. It is rendered as the model family's Hugging Face chat template renders it:
//   llama2: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
//   llama3: <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>...
//   chatml: <|im_start|>{role}\n{content}<|im_end|>\n...
// Template markers are single special-token ids, never the text of them. Loss weight 1: the
// tokens of every assistant turn's content and its end token (</s>, <|eot_id|>, <|im_end|>);
// 0: everything else (or 1 for every token with loss_on_all).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenize/corpus.h"
#include "data/tokenize/tokenizer.h"

namespace easyctx::data {

enum class ChatTemplate { Llama2, Llama3, ChatML };
const char* chat_template_name(ChatTemplate t);
// "llama2" | "llama3" | "chatml"; throws InputError otherwise.
ChatTemplate parse_chat_template(const std::string& name);
// Reads tokenizer_config.json next to the tokenizer file and recognises its chat_template by
// its markers (<|start_header_id|> -> llama3, <|im_start|> -> chatml, [INST] with <<SYS>> ->
// llama2). Throws InputError naming the file when it is absent, has no chat_template, or the
// template is none of the three.
ChatTemplate detect_chat_template(const std::string& tokenizer_path);

// Whether a JSON line looks like a chat record (an object with "messages", or with "prompt"
// and "response"); false for anything else, bad JSON included.
bool looks_like_chat(std::string_view json_line);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// Parses a chat record. Returns "" on success, otherwise why it is malformed: not a JSON
// object, neither messages nor prompt/response, a message that is not an object or lacks a
// string role/content, an unknown role, empty content, no assistant turn, invalid UTF-8, or
// (llama2, whose template requires it) roles not in the order [system] user assistant user ...
// doc.source is set from fields.source_path (default_source when absent); doc.text holds the
// contents joined, for length estimates.
std::string parse_chat_record(const RawRecord& r, const FieldOptions& fields, ChatTemplate t,
                              std::vector<ChatMessage>& messages, Document& doc);

class ChatRenderer {
 public:
  // Resolves the template's special tokens in `tok`; throws InputError naming the tokenizer
  // when one is missing (e.g. chatml with a tokenizer without <|im_start|>). piece_bytes: a
  // run of text longer than this goes to the tokenizer in pieces (Tokenizer::encode_pieces).
  ChatRenderer(const Tokenizer& tok, ChatTemplate t, bool loss_on_all, size_t piece_bytes = size_t(256) << 10);
  // Appends the ids of the rendered conversation and one weight (0/1) per id. Text between
  // two special tokens (a run) is encoded as one text, as the template's whole string would
  // be; a token of it gets the weight of the message part its text starts in (the tokens
  // past the encoding of the text before an assistant part are that part's). A run longer
  // than piece_bytes is encoded in pieces, the rule applied inside each piece: the same ids
  // and weights unless a cut was forced. Returns the number of forced cuts.
  size_t render(const std::vector<ChatMessage>& messages, std::vector<uint32_t>& ids, std::vector<uint8_t>& w) const;
  ChatTemplate chat_template() const { return t_; }
  bool adds_bos() const { return t_ != ChatTemplate::ChatML; }

 private:
  struct Part {
    int64_t special = -1;  // >= 0: this special token id; else `text`
    std::string text;
    uint8_t weight = 0;
  };
  size_t encode_parts(const std::vector<Part>& parts, std::vector<uint32_t>& ids, std::vector<uint8_t>& w) const;
  size_t encode_run(const std::vector<Part>& parts, size_t i, size_t j, std::vector<uint32_t>& ids,
                    std::vector<uint8_t>& w) const;
  const Tokenizer& tok_;
  ChatTemplate t_;
  bool all_;
  size_t piece_bytes_;
  int64_t bos_ = -1, eos_ = -1, start_hdr_ = -1, end_hdr_ = -1, eot_ = -1, im_start_ = -1, im_end_ = -1;
};

}  // namespace easyctx::data
