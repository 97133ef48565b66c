// UTF-8 helpers for corpus validation and the byte-level BPE.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/strings.h"

namespace easyctx::data {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);
// Byte offset of the first invalid sequence (overlong forms, surrogates, > U+10FFFF and
// truncated sequences are invalid), or kUtf8Valid.
size_t utf8_invalid_offset(std::string_view s);
// Number of code points (Python's len(str)) of valid UTF-8.
uint64_t utf8_length(std::string_view s);
using easyctx::append_utf8;  // lib/core/strings.h

}  // namespace easyctx::data
