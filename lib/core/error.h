// Errors: every failure in lib/ is an exception that carries its context (what was being
// done, the file/key/rank involved, what was expected). Apps catch at the boundary, print one
// line and exit non-zero; lib/ never calls exit().
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace easyctx {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: config keys, flags, data files, checkpoints.
class InputError : public Error {
 public:
  using Error::Error;
};

// "host:rank" of this process once the runtime knows it ("" before). Prefixed to messages
// of errors raised by communication and device calls so a failure names where it happened.
const std::string& process_label();
void set_process_label(std::string label);

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace easyctx

// EASYCTX_CHECK(cond, "what", value, "...") throws easyctx::Error with the pieces streamed.
#define EASYCTX_THROW(...) throw ::easyctx::Error(::easyctx::detail::concat(__VA_ARGS__))
#define EASYCTX_THROW_INPUT(...) throw ::easyctx::InputError(::easyctx::detail::concat(__VA_ARGS__))
#define EASYCTX_CHECK(cond, ...)             \
  do {                                       \
    if (!(cond)) EASYCTX_THROW(__VA_ARGS__); \
  } while (0)
#define EASYCTX_CHECK_INPUT(cond, ...)             \
  do {                                             \
    if (!(cond)) EASYCTX_THROW_INPUT(__VA_ARGS__); \
  } while (0)
