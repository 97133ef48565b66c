#include "core/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx {

bool Json::is_integer() const {
  if (type_ != Type::Number) return false;
  if (is_int_) return true;
  return std::isfinite(num_) && std::floor(num_) == num_ && std::fabs(num_) < 9.2e18;
}

const char* Json::type_name() const {
  switch (type_) {
    case Type::Null: return "null";
    case Type::Bool: return "bool";
    case Type::Number: return "number";
    case Type::String: return "string";
    case Type::Array: return "array";
    case Type::Object: return "object";
  }
  return "?";
}

bool Json::as_bool() const {
  EASYCTX_CHECK(type_ == Type::Bool, "JSON: expected a bool, got ", type_name());
  return bool_;
}
double Json::as_double() const {
  EASYCTX_CHECK(type_ == Type::Number, "JSON: expected a number, got ", type_name());
  return num_;
}
int64_t Json::as_int() const {
  EASYCTX_CHECK(is_integer(), "JSON: expected an integer, got ",
                type_ == Type::Number ? "a fractional number" : type_name());
  return is_int_ ? int_ : static_cast<int64_t>(num_);
}
const std::string& Json::as_string() const {
  EASYCTX_CHECK(type_ == Type::String, "JSON: expected a string, got ", type_name());
  return str_;
}
const Json::Array& Json::as_array() const {
  EASYCTX_CHECK(type_ == Type::Array, "JSON: expected an array, got ", type_name());
  return *arr_;
}
Json::Array& Json::as_array() {
  EASYCTX_CHECK(type_ == Type::Array, "JSON: expected an array, got ", type_name());
  return *arr_;
}
const Json::Object& Json::as_object() const {
  EASYCTX_CHECK(type_ == Type::Object, "JSON: expected an object, got ", type_name());
  return *obj_;
}

const Json* Json::find(std::string_view key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& kv : *obj_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
const Json* Json::find_path(const std::vector<std::string>& path) const {
  const Json* j = this;
  for (const std::string& k : path)
    if (!(j = j->find(k))) return nullptr;
  return j;
}
const Json& Json::at(std::string_view key) const {
  const Json* j = find(key);
  EASYCTX_CHECK(j != nullptr, "JSON: missing key \"", key, "\"");
  return *j;
}
Json& Json::set(std::string key, Json value) {
  if (type_ == Type::Null) *this = object();
  EASYCTX_CHECK(type_ == Type::Object, "JSON: set() on a ", type_name());
  if (!obj_) obj_ = std::make_shared<Object>();
  for (auto& kv : *obj_)
    if (kv.first == key) return kv.second = std::move(value);
  obj_->emplace_back(std::move(key), std::move(value));
  return obj_->back().second;
}
void Json::push_back(Json v) {
  if (type_ == Type::Null) *this = array();
  EASYCTX_CHECK(type_ == Type::Array, "JSON: push_back() on a ", type_name());
  if (!arr_) arr_ = std::make_shared<Array>();
  arr_->push_back(std::move(v));
}
size_t Json::size() const {
  if (type_ == Type::Array) return arr_ ? arr_->size() : 0;
  if (type_ == Type::Object) return obj_ ? obj_->size() : 0;
  return 0;
}

void json_escape(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

namespace {
void format_number(std::string& out, double v, bool is_int, int64_t iv) {
  if (is_int) {
    out += std::to_string(iv);
    return;
  }
  if (!std::isfinite(v)) {  // JSON has no inf/nan; write null like Python's json with allow_nan=False would refuse
    out += "null";
    return;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest representation that round-trips.
  for (int prec = 6; prec < 17; ++prec) {
    char b2[40];
    std::snprintf(b2, sizeof b2, "%.*g", prec, v);
    if (std::strtod(b2, nullptr) == v) {
      out += b2;
      return;
    }
  }
  out += buf;
}
}  // namespace

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (type_) {
    case Type::Null: out += "null"; break;
    case Type::Bool: out += bool_ ? "true" : "false"; break;
    case Type::Number: format_number(out, num_, is_int_, int_); break;
    case Type::String: json_escape(out, str_); break;
    case Type::Array: {
      out.push_back('[');
      size_t n = size();
      for (size_t i = 0; i < n; ++i) {
        if (i) out.push_back(',');
        newline(depth + 1);
        (*arr_)[i].dump_to(out, indent, depth + 1);
      }
      if (n) newline(depth);
      out.push_back(']');
      break;
    }
    case Type::Object: {
      out.push_back('{');
      size_t n = size();
      for (size_t i = 0; i < n; ++i) {
        if (i) out.push_back(',');
        newline(depth + 1);
        json_escape(out, (*obj_)[i].first);
        out += indent < 0 ? ":" : ": ";
        (*obj_)[i].second.dump_to(out, indent, depth + 1);
      }
      if (n) newline(depth);
      out.push_back('}');
      break;
    }
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

class JsonParser {
 public:
  JsonParser(std::string_view t, const std::string& src) : t_(t), src_(src) {}

  Json parse_document() {
    skip_ws();
    Json v = parse_value(0);
    skip_ws();
    if (p_ != t_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    EASYCTX_THROW_INPUT(src_, ": invalid JSON at line ", line, ", column ", col, ": ", what);
  }
  void skip_ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  char peek() const { return p_ < t_.size() ? t_[p_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++p_;
  }
  bool match_word(const char* w) {
    size_t n = std::char_traits<char>::length(w);
    if (t_.substr(p_, n) == w) {
      p_ += n;
      return true;
    }
    return false;
  }

  Json parse_value(int depth) {
    if (depth > 512) fail("nesting deeper than 512");
    char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Json(parse_string());
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (match_word("true")) return Json(true);
    if (match_word("false")) return Json(false);
    if (match_word("null")) return Json();
    if (p_ >= t_.size()) fail("unexpected end of input");
    fail(std::string("unexpected character '") + c + "'");
  }

  Json parse_object(int depth) {
    expect('{');
    Json obj = Json::object();
    obj.obj_ = std::make_shared<Json::Object>();
    skip_ws();
    if (peek() == '}') {
      ++p_;
      return obj;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      Json v = parse_value(depth + 1);
      obj.obj_->emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect('}');
      return obj;
    }
  }

  Json parse_array(int depth) {
    expect('[');
    Json arr = Json::array();
    arr.arr_ = std::make_shared<Json::Array>();
    skip_ws();
    if (peek() == ']') {
      ++p_;
      return arr;
    }
    for (;;) {
      skip_ws();
      arr.arr_->push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect(']');
      return arr;
    }
  }

  unsigned hex4() {
    if (p_ + 4 > t_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string");
      char c = t_[p_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated escape");
      char e = t_[p_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!(p_ + 1 < t_.size() && t_[p_] == '\\' && t_[p_ + 1] == 'u')) fail("unpaired high surrogate");
            p_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  Json parse_number() {
    size_t start = p_;
    bool is_int = true;
    if (peek() == '-') ++p_;
    if (peek() == '0') {
      ++p_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++p_;
    } else {
      fail("invalid number");
    }
    if (peek() == '.') {
      is_int = false;
      ++p_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number: digit expected after '.'");
      while (peek() >= '0' && peek() <= '9') ++p_;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_int = false;
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number: digit expected in exponent");
      while (peek() >= '0' && peek() <= '9') ++p_;
    }
    std::string s(t_.substr(start, p_ - start));
    if (is_int) {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (errno == 0) return Json(static_cast<int64_t>(v));
    }
    return Json(std::strtod(s.c_str(), nullptr));
  }

  std::string_view t_;
  const std::string& src_;
  size_t p_ = 0;
};

Json parse_json(std::string_view text, const std::string& source) { return JsonParser(text, source).parse_document(); }

}  // namespace easyctx
