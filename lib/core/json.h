// A small JSON value, parser and writer: safetensors headers, HF config.json, JSONL corpora,
// metrics.jsonl and checkpoint indexes. Strict RFC 8259 parsing (\uXXXX escapes and
// surrogate pairs, no trailing commas); errors give line and column. Objects keep key order.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace easyctx {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;  // insertion order

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::Bool), bool_(b) {}
  Json(double d) : type_(Type::Number), num_(d) {}
  Json(int v) : Json(static_cast<int64_t>(v)) {}
  Json(int64_t v) : type_(Type::Number), num_(static_cast<double>(v)), int_(v), is_int_(true) {}
  Json(uint64_t v) : Json(static_cast<int64_t>(v)) {}
  Json(const char* s) : type_(Type::String), str_(s) {}
  Json(std::string s) : type_(Type::String), str_(std::move(s)) {}
  Json(std::string_view s) : type_(Type::String), str_(s) {}
  static Json array() {
    Json j;
    j.type_ = Type::Array;
    return j;
  }
  static Json object() {
    Json j;
    j.type_ = Type::Object;
    return j;
  }
  // An object of these members in this order (set() of each: a key given twice keeps its last value).
  static Json object(std::initializer_list<std::pair<std::string, Json>> members) {
    Json j = object();
    for (const auto& [key, value] : members) j.set(key, value);
    return j;
  }
  // An array of the values of a range (each converted to Json).
  template <class Range>
  static Json array_of(const Range& values) {
    Json j = array();
    for (const auto& v : values) j.push_back(Json(v));
    return j;
  }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_integer() const;  // a number with no fraction that fits int64
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  const char* type_name() const;

  // Typed access; throw easyctx::Error naming the expected type.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;

  // Object access.
  const Json* find(std::string_view key) const;  // nullptr if absent (or not an object)
  // Nested objects: path[0], then path[1] inside it, ...; nullptr where one is absent.
  const Json* find_path(const std::vector<std::string>& path) const;
  const Json& at(std::string_view key) const;  // throws naming the key
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  Json& set(std::string key, Json value);  // insert or replace
  // Array access.
  void push_back(Json v);
  size_t size() const;
  const Json& operator[](size_t i) const { return as_array().at(i); }

  std::string dump(int indent = -1) const;  // -1: compact one line

 private:
  void dump_to(std::string& out, int indent, int depth) const;
  Type type_ = Type::Null;
  bool bool_ = false;
  double num_ = 0;
  int64_t int_ = 0;
  bool is_int_ = false;
  std::string str_;
  std::shared_ptr<Array> arr_;
  std::shared_ptr<Object> obj_;
  friend class JsonParser;
};

// Parses one JSON text. `source` names the input in errors ("config.json", "a.jsonl:17").
Json parse_json(std::string_view text, const std::string& source = "<json>");

// Appends the JSON string literal for s (with quotes) to out.
void json_escape(std::string& out, std::string_view s);

}  // namespace easyctx
