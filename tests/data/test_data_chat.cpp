// Chat records and templates for h5tokenize: ids and loss weights of hand-checked
// conversations for llama2, llama3 and chatml, the rendered ids equal the tokenizer's encoding
// of the template's whole string, record errors, and template detection (easyctx_tokenize).
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenize/chat.h"
#include "data/tokenize/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;
using easyctx::test::ScratchDir;
namespace fs = std::filesystem;

namespace {
using easyctx::test::llama2_path;
using easyctx::test::llama3_path;

using Ids = std::vector<uint32_t>;
using Weights = std::vector<uint8_t>;

// The byte tokenizer with the ChatML specials (<|im_start|> = 256, <|im_end|> = 257): every id
// is checkable by hand.
using test::chatml_byte_tokenizer_json;

// Ids of text in the byte tokenizer above.
void bytes(Ids& ids, Weights& w, const std::string& s, uint8_t weight) {
  for (unsigned char c : s) {
    ids.push_back(c);
    w.push_back(weight);
  }
}
void tok(Ids& ids, Weights& w, std::initializer_list<uint32_t> v, uint8_t weight) {
  for (uint32_t x : v) {
    ids.push_back(x);
    w.push_back(weight);
  }
}

std::vector<ChatMessage> sys_user_assistant() {
  return {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}};
}

std::string random_words(std::mt19937_64& rng) {
  static const char* words[] = {"the", "cat", "Hello", "world", "42", "x",      "!", "?",     "é",    "日本",
                                "a b", "  ",  "\n",    "don't", "<",  "[INST]", "|", "tab\t", "end.", "Zebra"};
  std::string s;
  int n = 1 + static_cast<int>(rng() % 12);
  for (int i = 0; i < n; ++i) s += std::string(words[rng() % 20]) + (rng() % 2 ? " " : "");
  return s + "w";  // never blank
}

std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r\f\v"), e = s.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

// Llama-2-chat: <s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>
TEST(DataChat, Llama2HandCheckedIdsAndWeights) {
  REQUIRE_FIXTURE(llama2_path());
  auto t = load_tokenizer(llama2_path());
  ChatRenderer r(*t, ChatTemplate::Llama2, false);
  Ids ids;
  Weights w;
  r.render(sys_user_assistant(), ids, w);
  Ids ei;
  Weights ew;
  tok(ei, ew, {1}, 0);                                       // <s>
  tok(ei, ew, {518, 25580, 29962}, 0);                       // ▁[ INST ]
  tok(ei, ew, {3532, 14816, 29903, 6778, 13}, 0);            // ▁<< SY S >> \n
  tok(ei, ew, {3629, 11473, 29889, 13}, 0);                  // Be ▁brief . \n
  tok(ei, ew, {29966, 829, 14816, 29903, 6778, 13, 13}, 0);  // < </ SY S >> \n \n
  tok(ei, ew, {18567}, 0);                                   // Hi (after \n: no ▁)
  tok(ei, ew, {518, 29914, 25580, 29962}, 0);                // ▁[ / INST ]
  tok(ei, ew, {15043, 29991, 29871}, 1);                     // ▁Hello ! ▁   (" Hello! ")
  tok(ei, ew, {2}, 1);                                       // </s>
  EXPECT_EQ(ids, ei);
  EXPECT_EQ(w, ew);
  // A second exchange starts again with <s>[INST]; "▁Hi" is 6324; both answers carry loss.
  auto msgs = sys_user_assistant();
  msgs.push_back({"user", "Hi"});
  msgs.push_back({"assistant", "Hello!"});
  Ids ids2;
  Weights w2;
  r.render(msgs, ids2, w2);
  Ids tail(ids2.begin() + ei.size(), ids2.end());
  Weights wtail(w2.begin() + ew.size(), w2.end());
  EXPECT_EQ(tail, (Ids{1, 518, 25580, 29962, 6324, 518, 29914, 25580, 29962, 15043, 29991, 29871, 2}));
  EXPECT_EQ(wtail, (Weights{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}));
  // --loss-on all: every token.
  ChatRenderer all(*t, ChatTemplate::Llama2, true);
  Ids ia;
  Weights wa;
  all.render(sys_user_assistant(), ia, wa);
  EXPECT_EQ(ia, ei);
  EXPECT_EQ(wa, Weights(ei.size(), 1));
}

// Llama 3: <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>...
TEST(DataChat, Llama3HandCheckedIdsAndWeights) {
  REQUIRE_FIXTURE(llama3_path());
  auto t = load_tokenizer(llama3_path());
  ChatRenderer r(*t, ChatTemplate::Llama3, false);
  Ids ids;
  Weights w;
  auto msgs = sys_user_assistant();
  msgs[2].content = "  Hello!\n";  // the template trims content
  r.render(msgs, ids, w);
  Ids ei;
  Weights ew;
  tok(ei, ew, {128000}, 0);                      // <|begin_of_text|>
  tok(ei, ew, {128006, 9125, 128007, 271}, 0);   // <|start_header_id|> system <|end_header_id|> \n\n
  tok(ei, ew, {3513, 10015, 13, 128009}, 0);     // Be Ġbrief . <|eot_id|>
  tok(ei, ew, {128006, 882, 128007, 271}, 0);    // user
  tok(ei, ew, {13347, 128009}, 0);               // Hi <|eot_id|>
  tok(ei, ew, {128006, 78191, 128007, 271}, 0);  // assistant
  tok(ei, ew, {9906, 0, 128009}, 1);             // Hello ! <|eot_id|>
  EXPECT_EQ(ids, ei);
  EXPECT_EQ(w, ew);
}

// ChatML: <|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n...
TEST(DataChat, ChatmlHandCheckedIdsAndWeights) {
  ScratchDir dir("chatml");
  easyctx::test::write_text(dir / "tokenizer.json", chatml_byte_tokenizer_json());
  auto t = load_tokenizer(dir / "tokenizer.json");
  ChatRenderer r(*t, ChatTemplate::ChatML, false);
  EXPECT_FALSE(r.adds_bos());
  Ids ids;
  Weights w;
  r.render(sys_user_assistant(), ids, w);
  Ids ei;
  Weights ew;
  tok(ei, ew, {256}, 0);
  bytes(ei, ew, "system\nBe brief.", 0);
  tok(ei, ew, {257}, 0);
  bytes(ei, ew, "\n", 0);
  tok(ei, ew, {256}, 0);
  bytes(ei, ew, "user\nHi", 0);
  tok(ei, ew, {257}, 0);
  bytes(ei, ew, "\n", 0);
  tok(ei, ew, {256}, 0);
  bytes(ei, ew, "assistant\n", 0);
  bytes(ei, ew, "Hello!", 1);
  tok(ei, ew, {257}, 1);  // <|im_end|> closes the answer: trained
  bytes(ei, ew, "\n", 0);
  EXPECT_EQ(ids, ei);
  EXPECT_EQ(w, ew);
  // A tokenizer without the ChatML specials cannot render it: the error names the tokenizer.
  if (fs::exists(llama3_path())) {
    auto l3 = load_tokenizer(llama3_path());
    try {
      ChatRenderer bad(*l3, ChatTemplate::ChatML, false);
      ADD_FAILURE() << "chatml accepted a tokenizer without <|im_start|>";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("<|im_start|>"), std::string::npos) << e.what();
    }
  }
}

// On random conversations the rendered ids are the tokenizer's encoding of the template's
// whole string (special tokens as ids), and the weight-1 tokens decode to the answers.
TEST(DataChat, RenderEqualsEncodingOfTheTemplateString) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("chat-rand");
  easyctx::test::write_text(dir / "tokenizer.json", chatml_byte_tokenizer_json());
  struct Case {
    ChatTemplate t;
    std::string path;
  };
  std::vector<Case> cases{{ChatTemplate::ChatML, dir / "tokenizer.json"}};
  if (fs::exists(llama3_path())) cases.push_back({ChatTemplate::Llama3, llama3_path()});
  if (fs::exists(llama2_path())) cases.push_back({ChatTemplate::Llama2, llama2_path()});
  for (const Case& c : cases) {
    auto t = load_tokenizer(c.path);
    ChatRenderer r(*t, c.t, false);
    for (int it = 0; it < 40; ++it) {
      std::vector<ChatMessage> m;
      if (rng() % 2) m.push_back({"system", random_words(rng)});
      const int turns = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < turns; ++k) {
        m.push_back({"user", random_words(rng)});
        m.push_back({"assistant", random_words(rng)});
      }
      Ids ids;
      Weights w;
      r.render(m, ids, w);
      ASSERT_EQ(ids.size(), w.size());
      Ids expect;
      std::string answers, trained;
      if (c.t == ChatTemplate::Llama2) {
        // Meta's reference: each exchange is BOS + encode("[INST] user [/INST] answer ") + EOS.
        size_t first = m[0].role == "system" ? 1 : 0;
        for (size_t k = first; k < m.size(); k += 2) {
          std::string u =
              k == first && first ? "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + m[k].content : m[k].content;
          expect.push_back(1);
          t->encode("[INST] " + strip(u) + " [/INST] " + strip(m[k + 1].content) + " ", expect);
          expect.push_back(2);
          answers += strip(m[k + 1].content);
        }
      } else {
        std::string s = c.t == ChatTemplate::Llama3 ? "<|begin_of_text|>" : "";
        for (const auto& x : m) {
          if (c.t == ChatTemplate::Llama3)
            s += "<|start_header_id|>" + x.role + "<|end_header_id|>\n\n" + strip(x.content) + "<|eot_id|>";
          else s += "<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n";
          if (x.role == "assistant") answers += c.t == ChatTemplate::Llama3 ? strip(x.content) : x.content;
        }
        t->encode(s, expect);  // the HF tokenizers cut special tokens out of the text first
      }
      ASSERT_EQ(ids, expect) << chat_template_name(c.t);
      // Weight-1 tokens, end tokens dropped, decode to the answers (llama2: with the spaces
      // around them).
      Ids kept;
      for (size_t i = 0; i < ids.size(); ++i)
        if (w[i] && ids[i] != 2 && ids[i] != 257 && ids[i] != 128009) kept.push_back(ids[i]);
      std::string dec = t->decode(kept);
      std::string squeezed;
      for (char ch : dec)
        if (ch != ' ') squeezed += ch;
      std::string want;
      for (char ch : answers)
        if (ch != ' ') want += ch;
      EXPECT_EQ(squeezed, want) << chat_template_name(c.t);
    }
  }
}

// Long runs of text go to the tokenizer in pieces (bounded memory): the ids and weights equal
// those of the whole run whenever no cut was forced, for every template and tokenizer at hand,
// with pieces small enough that every run is cut, often at a part boundary.
TEST(DataChat, RenderInPiecesEqualsWholeRun) {
  std::mt19937_64 rng(easyctx::test::test_seed());
  ScratchDir dir("chat-pieces");
  easyctx::test::write_text(dir / "tokenizer.json", chatml_byte_tokenizer_json());
  std::vector<std::pair<ChatTemplate, std::string>> cases{{ChatTemplate::ChatML, dir / "tokenizer.json"}};
  if (fs::exists(llama3_path())) cases.push_back({ChatTemplate::Llama3, llama3_path()});
  if (fs::exists(llama2_path())) cases.push_back({ChatTemplate::Llama2, llama2_path()});
  int exact = 0, trials = 0;
  for (const auto& [t, path] : cases) {
    auto tk = load_tokenizer(path);
    for (bool all : {false, true}) {
      ChatRenderer whole(*tk, t, all, size_t(1) << 40);
      for (int it = 0; it < 20; ++it, ++trials) {
        ChatRenderer pieces(*tk, t, all, 8 + rng() % 40);
        std::vector<ChatMessage> m;
        if (rng() % 2) m.push_back({"system", random_words(rng) + random_words(rng)});
        for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
          m.push_back({"user", random_words(rng) + " " + random_words(rng)});
          std::string a;
          for (int j = 0; j < 1 + static_cast<int>(rng() % 6); ++j) a += random_words(rng) + " ";
          m.push_back({"assistant", a + "end"});
        }
        Ids ia, ib;
        Weights wa, wb;
        whole.render(m, ia, wa);
        if (pieces.render(m, ib, wb) != 0) continue;
        ASSERT_EQ(ib, ia) << chat_template_name(t);
        ASSERT_EQ(wb, wa) << chat_template_name(t) << (all ? " (loss on all)" : "");
        ++exact;
      }
    }
  }
  EXPECT_GE(exact, trials * 9 / 10) << "cuts forced too often";
}

TEST(DataChat, RecordErrors) {
  FieldOptions f;
  std::vector<ChatMessage> m;
  Document d;
  std::string file = "c.jsonl";
  auto rec = [&](std::string_view s, ChatTemplate t = ChatTemplate::Llama3) {
    RawRecord r;
    r.data = s;
    r.file = &file;
    r.line = 3;
    return parse_chat_record(r, f, t, m, d);
  };
  EXPECT_EQ(rec(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"), "");
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(d.source, "unknown");
  EXPECT_EQ(rec(R"({"prompt": "p", "response": "r", "system": "s", "meta": {"redpajama_set_name": "sft"}})"), "");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[2].content, "r");
  EXPECT_EQ(d.source, "sft");
  EXPECT_NE(rec("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(rec("\"text\"").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(rec(R"({"messages": [)").find("bad JSON"), std::string::npos);
  EXPECT_NE(rec(R"({"text": "x"})").find("neither"), std::string::npos);
  EXPECT_NE(rec(R"({"messages": {"role": "user"}})").find("expected an array"), std::string::npos);
  EXPECT_NE(rec(R"({"messages": ["hi"]})").find("message 0 is string"), std::string::npos);
  EXPECT_NE(rec(R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})")
                .find("unknown role 'bot'"),
            std::string::npos);
  EXPECT_NE(rec(R"({"messages": [{"role": "user", "content": "a"}]})").find("no assistant turn"), std::string::npos);
  EXPECT_NE(rec(R"({"messages": [{"role": "user", "content": " \n"}, {"role": "assistant", "content": "b"}]})")
                .find("message 0 (user) has empty content"),
            std::string::npos);
  EXPECT_NE(rec(R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "b"}]})").find("content"),
            std::string::npos);
  EXPECT_NE(rec(R"({"messages": []})").find("no messages"), std::string::npos);
  EXPECT_NE(rec(R"({"prompt": "p", "response": 3})").find("not strings"), std::string::npos);
  // Llama-2's template needs [system] user assistant user ...; the others take any order.
  const char* two_users =
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})";
  EXPECT_NE(rec(two_users, ChatTemplate::Llama2).find("llama2 template"), std::string::npos);
  EXPECT_EQ(rec(two_users, ChatTemplate::ChatML), "");
  EXPECT_TRUE(looks_like_chat(R"({"messages": []})"));
  EXPECT_TRUE(looks_like_chat(R"({"prompt": "a", "response": "b"})"));
  EXPECT_FALSE(looks_like_chat(R"({"text": "a"})"));
  EXPECT_FALSE(looks_like_chat(R"({"prompt": "a"})"));
  EXPECT_FALSE(looks_like_chat("not json"));
}

TEST(DataChat, TemplateFromTokenizerConfig) {
  ScratchDir dir("chat-detect");
  const std::string tokp = dir / "tokenizer.json";
  auto cfg = [&](const std::string& tmpl) {
    Json j = Json::object();
    j.set("chat_template", tmpl);
    easyctx::test::write_text(dir / "tokenizer_config.json", j.dump());
  };
  cfg("{% for m in messages %}{{'<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'}}{% endfor %}");
  EXPECT_EQ(detect_chat_template(tokp), ChatTemplate::Llama3);
  cfg("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}");
  EXPECT_EQ(detect_chat_template(tokp), ChatTemplate::ChatML);
  cfg("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + content + ' [/INST]' }}");
  EXPECT_EQ(detect_chat_template(tokp), ChatTemplate::Llama2);
  // Mistral's [INST] without <<SYS>> is not Llama-2's template.
  cfg("{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}");
  try {
    detect_chat_template(tokp);
    ADD_FAILURE() << "an unknown template was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  // A list of named templates: the default one.
  Json list = Json::array();
  for (auto [name, t] :
       {std::pair<const char*, const char*>{"tool_use", "<|im_start|>"}, {"default", "<|start_header_id|>"}}) {
    Json e = Json::object();
    e.set("name", name);
    e.set("template", t);
    list.push_back(e);
  }
  Json j = Json::object();
  j.set("chat_template", list);
  easyctx::test::write_text(dir / "tokenizer_config.json", j.dump());
  EXPECT_EQ(detect_chat_template(tokp), ChatTemplate::Llama3);
  easyctx::test::write_text(dir / "tokenizer_config.json", "{}");
  EXPECT_THROW(detect_chat_template(tokp), InputError);
  fs::remove(dir / "tokenizer_config.json");
  EXPECT_THROW(detect_chat_template(tokp), InputError);
  EXPECT_EQ(parse_chat_template("chatml"), ChatTemplate::ChatML);
  EXPECT_THROW(parse_chat_template("vicuna"), InputError);
}
