#include "data/tokenize/chat.h"

#include <filesystem>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/tokenize/utf8.h"

namespace easyctx::data {
namespace fs = std::filesystem;

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::Llama2: return "llama2";
    case ChatTemplate::Llama3: return "llama3";
    case ChatTemplate::ChatML: return "chatml";
  }
  return "?";
}

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "llama2") return ChatTemplate::Llama2;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "chatml") return ChatTemplate::ChatML;
  EASYCTX_THROW_INPUT("--chat-template ", name, ": expected llama2, llama3, chatml or auto");
}

ChatTemplate detect_chat_template(const std::string& tokenizer_path) {
  const std::string cfg = (fs::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
  EASYCTX_CHECK_INPUT(fs::is_regular_file(cfg), "--chat-template auto: ", cfg,
                      " does not exist (it names the template); pass --chat-template llama2, llama3 or chatml");
  Json j = parse_json(read_file(cfg), cfg);
  const Json* t = j.is_object() ? j.find("chat_template") : nullptr;
  EASYCTX_CHECK_INPUT(t, cfg, ": no chat_template; pass --chat-template llama2, llama3 or chatml");
  std::string text;
  if (t->is_string()) {
    text = t->as_string();
  } else if (t->is_array()) {  // named templates: the "default" one
    for (const Json& e : t->as_array())
      if (e.is_object() && e.find("name") && e.at("name").is_string() && e.at("name").as_string() == "default" &&
          e.find("template") && e.at("template").is_string())
        text = e.at("template").as_string();
    EASYCTX_CHECK_INPUT(!text.empty(), cfg, ": chat_template is a list without a \"default\" template");
  } else {
    EASYCTX_THROW_INPUT(cfg, ": chat_template is ", t->type_name(), ", expected a string");
  }
  if (text.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::Llama3;
  if (text.find("<|im_start|>") != std::string::npos) return ChatTemplate::ChatML;
  if (text.find("[INST]") != std::string::npos && text.find("<<SYS>>") != std::string::npos)
    return ChatTemplate::Llama2;
  EASYCTX_THROW_INPUT(cfg,
                      ": chat_template is none of llama2 ([INST] with <<SYS>>), llama3 (<|start_header_id|>) "
                      "or chatml (<|im_start|>); pass --chat-template to render with one of them");
}

namespace {
// Python's str.strip() / Jinja's trim on the ASCII whitespace chat texts use.
std::string strip(std::string_view s) {
  size_t b = 0, e = s.size();
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (b < e && ws(s[b])) ++b;
  while (e > b && ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

bool looks_like_chat(std::string_view line) {
  try {
    Json j = parse_json(line, "record");
    return j.is_object() && (j.find("messages") || (j.find("prompt") && j.find("response")));
  } catch (const Error&) { return false; }
}

std::string parse_chat_record(const RawRecord& r, const FieldOptions& fields, ChatTemplate t,
                              std::vector<ChatMessage>& messages, Document& doc) {
  messages.clear();
  if (r.is_text_file) return "a .txt file is not a chat record (chat input is JSON Lines)";
  Json j;
  try {
    j = parse_json(r.data, *r.file + ":" + std::to_string(r.line));
  } catch (const Error& e) { return std::string("bad JSON: ") + e.what(); }
  if (!j.is_object()) return std::string("chat record is ") + j.type_name() + ", expected a JSON object";
  if (const Json* m = j.find("messages")) {
    if (!m->is_array()) return std::string("\"messages\" is ") + m->type_name() + ", expected an array";
    size_t k = 0;
    for (const Json& e : m->as_array()) {
      const std::string at = "message " + std::to_string(k++);
      if (!e.is_object()) return at + " is " + e.type_name() + ", expected an object with role and content";
      const Json* role = e.find("role");
      const Json* content = e.find("content");
      if (!role || !role->is_string()) return at + ": missing or non-string \"role\"";
      if (!content || !content->is_string()) return at + ": missing or non-string \"content\"";
      messages.push_back({role->as_string(), content->as_string()});
    }
  } else if (j.find("prompt") && j.find("response")) {
    const Json* sys = j.find("system");
    if (sys && !sys->is_null()) {
      if (!sys->is_string()) return "\"system\" is not a string";
      messages.push_back({"system", sys->as_string()});
    }
    if (!j.at("prompt").is_string() || !j.at("response").is_string()) return "\"prompt\"/\"response\" are not strings";
    messages.push_back({"user", j.at("prompt").as_string()});
    messages.push_back({"assistant", j.at("response").as_string()});
  } else {
    return "chat record has neither \"messages\" nor \"prompt\" and \"response\"";
  }
  bool assistant = false;
  doc.text.clear();
  for (size_t k = 0; k < messages.size(); ++k) {
    const ChatMessage& m = messages[k];
    const std::string at = "message " + std::to_string(k);
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return at + ": unknown role '" + m.role + "' (expected system, user or assistant)";
    if (strip(m.content).empty()) return at + " (" + m.role + ") has empty content";
    size_t bad = utf8_invalid_offset(m.content);
    if (bad != kUtf8Valid) return at + ": invalid UTF-8 in the content at byte " + std::to_string(bad);
    assistant |= m.role == "assistant";
    doc.text += m.content;
    doc.text += '\n';
  }
  if (messages.empty()) return "chat record has no messages";
  if (!assistant) return "conversation has no assistant turn (nothing to train on)";
  if (t == ChatTemplate::Llama2) {
    // The Llama-2 template: an optional leading system message, then user/assistant turns
    // alternating from user (its Jinja raises otherwise).
    size_t first = messages[0].role == "system" ? 1 : 0;
    for (size_t k = first; k < messages.size(); ++k) {
      const char* want = (k - first) % 2 == 0 ? "user" : "assistant";
      if (messages[k].role != want)
        return "message " + std::to_string(k) + " is " + messages[k].role + ", but the llama2 template needs " +
               "[system] then user/assistant turns alternating from user";
    }
  }
  const Json* s = j.find_path(fields.source_path);
  doc.source = (s && s->is_string() && !s->as_string().empty()) ? s->as_string() : fields.default_source;
  return "";
}

ChatRenderer::ChatRenderer(const Tokenizer& tok, ChatTemplate t, bool loss_on_all, size_t piece_bytes)
    : tok_(tok), t_(t), all_(loss_on_all), piece_bytes_(piece_bytes) {
  auto need = [&](const char* text) {
    int64_t id = tok.special_id(text);
    EASYCTX_CHECK_INPUT(id >= 0, tok.path(), ": the ", chat_template_name(t), " chat template needs the special token ",
                        text, ", which this tokenizer does not have; pick the template of this tokenizer's model");
    return id;
  };
  switch (t) {
    case ChatTemplate::Llama2:
      bos_ = tok.bos_id();
      eos_ = tok.eos_id();
      EASYCTX_CHECK_INPUT(bos_ >= 0 && eos_ >= 0, tok.path(), ": the llama2 chat template needs BOS and EOS tokens");
      break;
    case ChatTemplate::Llama3:
      bos_ = need("<|begin_of_text|>");
      start_hdr_ = need("<|start_header_id|>");
      end_hdr_ = need("<|end_header_id|>");
      eot_ = need("<|eot_id|>");
      break;
    case ChatTemplate::ChatML:
      im_start_ = need("<|im_start|>");
      im_end_ = need("<|im_end|>");
      break;
  }
}

namespace {
// The weights of the ids of a text cut into parts, as ChatRenderer::render defines them:
// enc(end, out) encodes the text up to byte `end`; `bounds` are the starts of the parts after
// the first (ascending) with their weights; w0 is the first part's weight. The tokens of
// enc(through part k) past its common prefix with enc(through part k-1) get part k's weight.
template <typename Enc>
void weigh(const Enc& enc, size_t e, const std::vector<std::pair<size_t, uint8_t>>& bounds, uint8_t w0,
           std::vector<uint32_t>& ids, std::vector<uint8_t>& w) {
  std::vector<uint32_t> prev, cur;
  std::vector<uint8_t> weights;
  for (size_t k = 0; k <= bounds.size(); ++k) {
    cur.clear();
    enc(k < bounds.size() ? bounds[k].first : e, cur);
    size_t common = 0;
    while (common < prev.size() && common < cur.size() && prev[common] == cur[common]) ++common;
    weights.resize(common);
    weights.resize(cur.size(), k == 0 ? w0 : bounds[k - 1].second);
    prev.swap(cur);
  }
  ids.insert(ids.end(), prev.begin(), prev.end());
  w.insert(w.end(), weights.begin(), weights.end());
}
}  // namespace

// Runs of text between special tokens are encoded whole (weigh). A run longer than
// piece_bytes_ goes to the tokenizer in pieces; inside each piece the same rule applies to
// the parts it holds, the first part being the one holding the piece's first byte.
size_t ChatRenderer::encode_parts(const std::vector<Part>& parts, std::vector<uint32_t>& ids,
                                  std::vector<uint8_t>& w) const {
  size_t i = 0, forced = 0;
  while (i < parts.size()) {
    if (parts[i].special >= 0) {
      ids.push_back(static_cast<uint32_t>(parts[i].special));
      w.push_back(all_ ? 1 : parts[i].weight);
      ++i;
      continue;
    }
    size_t j = i;
    while (j < parts.size() && parts[j].special < 0) ++j;
    forced += encode_run(parts, i, j, ids, w);
    i = j;
  }
  return forced;
}

size_t ChatRenderer::encode_run(const std::vector<Part>& parts, size_t i, size_t j, std::vector<uint32_t>& ids,
                                std::vector<uint8_t>& w) const {
  std::string text;
  std::vector<std::pair<size_t, uint8_t>> starts;  // every part's first byte and weight
  for (size_t k = i; k < j; ++k) {
    starts.emplace_back(text.size(), all_ ? 1 : parts[k].weight);
    text += parts[k].text;
  }
  if (text.size() <= piece_bytes_) {
    weigh([&](size_t end, std::vector<uint32_t>& out) { tok_.encode(std::string_view(text).substr(0, end), out); },
          text.size(), {starts.begin() + 1, starts.end()}, starts[0].second, ids, w);
    return 0;
  }
  std::vector<uint32_t> run;
  std::vector<Tokenizer::Piece> pieces;
  const size_t forced = tok_.encode_pieces(text, run, piece_bytes_, &pieces);
  for (const Tokenizer::Piece& p : pieces) {
    uint8_t w0 = starts[0].second;
    std::vector<std::pair<size_t, uint8_t>> inner;
    for (const auto& st : starts) {
      if (st.first <= p.begin) w0 = st.second;
      else if (st.first < p.end) inner.push_back(st);
    }
    if (inner.empty()) {  // one part: the piece's ids as encode_pieces gave them
      ids.insert(ids.end(), run.begin() + p.ids_begin, run.begin() + p.ids_end);
      w.insert(w.end(), p.ids_end - p.ids_begin, w0);
      continue;
    }
    weigh([&](size_t end, std::vector<uint32_t>& out) { tok_.encode_piece(text, p, end, out); }, p.end, inner, w0, ids,
          w);
  }
  return forced;
}

size_t ChatRenderer::render(const std::vector<ChatMessage>& msgs, std::vector<uint32_t>& ids,
                            std::vector<uint8_t>& w) const {
  std::vector<Part> parts;
  auto special = [&](int64_t id, uint8_t weight) { parts.push_back({id, {}, weight}); };
  auto text = [&](std::string s, uint8_t weight) { parts.push_back({-1, std::move(s), weight}); };
  switch (t_) {
    case ChatTemplate::Llama2: {
      // HF Llama-2-chat: the system prompt joins the first user message; content.strip().
      size_t first = !msgs.empty() && msgs[0].role == "system" ? 1 : 0;
      for (size_t k = first; k < msgs.size(); ++k) {
        const ChatMessage& m = msgs[k];
        if (m.role == "user") {
          std::string c =
              (k == first && first == 1) ? "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + m.content : m.content;
          special(bos_, 0);
          text("[INST] " + strip(c) + " [/INST]", 0);
        } else {
          text(" " + strip(m.content) + " ", 1);
          special(eos_, 1);
        }
      }
      break;
    }
    case ChatTemplate::Llama3:
      special(bos_, 0);
      for (const ChatMessage& m : msgs) {
        const uint8_t a = m.role == "assistant" ? 1 : 0;
        special(start_hdr_, 0);
        text(m.role, 0);
        special(end_hdr_, 0);
        text("\n\n", 0);
        text(strip(m.content), a);
        special(eot_, a);
      }
      break;
    case ChatTemplate::ChatML:
      for (const ChatMessage& m : msgs) {
        const uint8_t a = m.role == "assistant" ? 1 : 0;
        special(im_start_, 0);
        text(m.role + "\n", 0);
        text(m.content, a);
        special(im_end_, a);
        text("\n", 0);
      }
      break;
  }
  return encode_parts(parts, ids, w);
}

}  // namespace easyctx::data
