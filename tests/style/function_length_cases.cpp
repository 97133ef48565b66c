// Cases for scripts/check_function_length.py, run with --limit 4 by test_function_length.sh:
// each function named long_* has 5 lines or more, each named short_* 4 or fewer.
#include <string>

namespace cases {

int long_multi_line_signature(int a,
                              int b) {
  int c = a + b;
  return c;
}

int short_one(int a) {
  return a;
}

// Braces in strings, characters and comments do not count: { { {
int long_with_literals() {
  const char* s = "}}}";
  char c = '}';  // }
  return s[0] + c;
}

// A lambda at namespace scope is not a function here.
const auto kTable = [] {
  int x = 0;
  ++x;
  ++x;
  return x;
}();

struct Holder {
  Holder(int a, int b)
      : a_{a},
        b_(b) {
    a_ += b_;
  }
  int short_member() const { return a_; }
  int a_, b_;
};

template <class T>
T long_template(T t) {
  t += 1;
  t += 2;
  return t;
}

}  // namespace cases
