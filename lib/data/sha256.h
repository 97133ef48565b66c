// SHA-256 (FIPS 180-4), implemented here so the data module needs no crypto library.
// Used to fingerprint tokenizer files: shards record the hash of the tokenizer that made
// them and the loader can insist on the same one.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace easyctx::data {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated after
  std::string hex_digest();          // 64 lowercase hex characters

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Hash of a file's bytes; throws InputError naming the path when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace easyctx::data
