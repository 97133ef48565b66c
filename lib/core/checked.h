// Overflow-checked size arithmetic. Every size derived from user input (model dimensions,
// sequence length x batch, element and byte counts, lengths read from files) is computed
// with these, so an absurd value ends in an InputError naming what overflowed, never in a
// wrapped number that plans as "fits" or in a std::length_error naming nothing.
//
//   const int64_t per_layer = checked_product({3, d, ff}, "llama.yaml: 3 x hidden_size x intermediate_size");
//   const int64_t n = checked_elements({batch, seq, d}, "activations: batch x seq x hidden_size");
#pragma once
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace easyctx {

// The largest element count one buffer, tensor or whole model may have: 2^50 (about 10^15).
// Far above any machine's memory, and low enough that byte counts derived from it (16 bytes
// per element, times the ranks of a node) stay inside 64 bits.
inline constexpr int64_t kMaxElements = int64_t{1} << 50;

namespace detail {
template <typename T>
[[noreturn]] void throw_overflow(std::string_view what, const char* op, std::initializer_list<T> v) {
  std::ostringstream os;
  os << what << ": ";
  bool first = true;
  for (T x : v) {
    os << (first ? "" : op) << x;
    first = false;
  }
  os << " overflows a " << 8 * sizeof(T) << "-bit " << (std::is_signed_v<T> ? "signed" : "unsigned")
     << " integer (a size out of any sane range)";
  throw InputError(os.str());
}
}  // namespace detail

// a x b; InputError "<what>: a x b overflows ..." when the product does not fit T.
template <typename T>
T checked_mul(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>, "checked_mul: integers only");
  T r;
  if (__builtin_mul_overflow(a, b, &r)) detail::throw_overflow<T>(what, " x ", {a, b});
  return r;
}

// a + b; InputError "<what>: a + b overflows ..." when the sum does not fit T.
template <typename T>
T checked_add(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>, "checked_add: integers only");
  T r;
  if (__builtin_add_overflow(a, b, &r)) detail::throw_overflow<T>(what, " + ", {a, b});
  return r;
}

// The product of every factor (int64); InputError naming all factors when it overflows.
inline int64_t checked_product(std::initializer_list<int64_t> factors, std::string_view what) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) detail::throw_overflow<int64_t>(what, " x ", factors);
  return r;
}

// An element count: the product of non-negative factors, at most kMaxElements; InputError
// naming `what` and every factor otherwise.
inline int64_t checked_elements(std::initializer_list<int64_t> factors, std::string_view what) {
  for (int64_t f : factors)
    if (f < 0) {
      std::ostringstream os;
      os << what << ": negative size " << f;
      throw InputError(os.str());
    }
  const int64_t n = checked_product(factors, what);
  if (n > kMaxElements) {
    std::ostringstream os;
    os << what << ": ";
    bool first = true;
    for (int64_t f : factors) {
      os << (first ? "" : " x ") << f;
      first = false;
    }
    os << " = " << n << " elements, more than the limit of 2^50 (" << kMaxElements << ")";
    throw InputError(os.str());
  }
  return n;
}

}  // namespace easyctx
