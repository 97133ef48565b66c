#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"

using namespace easyctx;

TEST(Json, ParsesAndDumps) {
  Json j = parse_json(R"({"a": 1, "b": [true, null, -2.5e3, "x\u00e9\ud83d\ude00"], "c": {"d": 12345678901234}})");
  EXPECT_EQ(j.at("a").as_int(), 1);
  EXPECT_TRUE(j.at("b")[0].as_bool());
  EXPECT_TRUE(j.at("b")[1].is_null());
  EXPECT_DOUBLE_EQ(j.at("b")[2].as_double(), -2500.0);
  EXPECT_EQ(j.at("b")[3].as_string(), "x\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(j.at("c").at("d").as_int(), 12345678901234LL);
  Json k = parse_json(j.dump());
  EXPECT_EQ(k.dump(), j.dump());
  EXPECT_EQ(parse_json(j.dump(2)).dump(), j.dump());
}

TEST(Json, ErrorsGiveLineAndColumn) {
  const char* bad[] = {"{\"a\": }", "[1, 2,]", "{\"a\" 1}", "\"\\ud800\"", "tru", "{\"a\": 1} x", "\"a\nb\""};
  for (const char* b : bad) {
    try {
      parse_json(b, "f.json");
      FAIL() << "accepted: " << b;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("f.json: invalid JSON at line "), std::string::npos) << e.what();
    }
  }
  try {
    parse_json("{\n  \"a\": [1,\n  2,, 3]}", "g.json");
    FAIL();
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what(); }
}

// join is split's inverse (the messages that list several problems, "a; b", are built with it).
TEST(Strings, JoinIsTheInverseOfSplit) {
  EXPECT_EQ(join({}, "; "), "");
  EXPECT_EQ(join({"one"}, "; "), "one");
  EXPECT_EQ(join({"a", "", "c"}, "; "), "a; ; c");
  for (const std::string s : {"", "x", "a,b", ",a,,b,"}) EXPECT_EQ(join(split(s, ','), ","), s) << s;
}
