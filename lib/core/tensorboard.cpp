#include "core/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::tb {
namespace fs = std::filesystem;
namespace {

constexpr uint32_t kWireVarint = 0, kWire64 = 1, kWireLen = 2, kWire32 = 5;
constexpr char kFilePrefix[] = "events.out.tfevents.";

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}

template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as protobuf and TFRecord store them
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));  // the value's bytes in the low bytes (a little-endian host)
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

template <typename T>
T get_fixed(const char* p) {
  uint64_t bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) bits |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

void put_bytes(std::string& out, uint32_t field, const std::string& s) {
  put_key(out, field, kWireLen);
  put_varint(out, s.size());
  out += s;
}

// Event { wall_time = 1; step = 2 } with `what` (already keyed) after them.
std::string event_with(double wall_time, int64_t step, const std::string& what) {
  std::string e;
  put_key(e, 1, kWire64);
  put_fixed(e, wall_time);
  if (step != 0) {  // proto3 leaves a zero out
    put_key(e, 2, kWireVarint);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e + what;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A cursor over protobuf bytes; every read checks the bounds and throws naming `where`.
struct Reader {
  const std::string& s;
  size_t pos;
  size_t end;
  const std::string& where;
  bool done() const { return pos >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      EASYCTX_CHECK(pos < end, where, ": truncated varint");
      const uint8_t b = static_cast<uint8_t>(s[pos++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    EASYCTX_THROW(where, ": varint longer than 10 bytes");
  }
  std::pair<size_t, size_t> length_delimited() {
    const uint64_t n = varint();
    EASYCTX_CHECK(n <= end - pos, where, ": field length ", n, " runs past the message");
    const size_t b = pos;
    pos += static_cast<size_t>(n);
    return {b, static_cast<size_t>(n)};
  }
  const char* fixed(size_t n) {
    EASYCTX_CHECK(n <= end - pos, where, ": truncated fixed-width field");
    const char* p = s.data() + pos;
    pos += n;
    return p;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case kWireVarint: varint(); break;
      case kWire64: fixed(8); break;
      case kWireLen: length_delimited(); break;
      case kWire32: fixed(4); break;
      default: EASYCTX_THROW(where, ": unsupported wire type ", wire);
    }
  }
};

Scalar decode_value(const std::string& s, size_t b, size_t n, const std::string& where) {
  Reader r{s, b, b + n, where};
  Scalar v{"", 0.0f};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == kWireLen) {
      const auto [tb, tn] = r.length_delimited();
      v.first = s.substr(tb, tn);
    } else if (field == 2 && wire == kWire32) {
      v.second = get_fixed<float>(r.fixed(4));
    } else {
      r.skip(wire);
    }
  }
  return v;
}

void decode_summary(const std::string& s, size_t b, size_t n, const std::string& where, Event& e) {
  Reader r{s, b, b + n, where};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == kWireLen) {
      const auto [vb, vn] = r.length_delimited();
      e.values.push_back(decode_value(s, vb, vn, where));
    } else {
      r.skip(wire);
    }
  }
}

int decode_session_status(const std::string& s, size_t b, size_t n, const std::string& where) {
  Reader r{s, b, b + n, where};
  int status = 0;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto wire = static_cast<uint32_t>(key & 7);
    if ((key >> 3) == 1 && wire == kWireVarint) status = static_cast<int>(r.varint());
    else r.skip(wire);
  }
  return status;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

std::string encode_file_version_event(double wall_time) {
  std::string what;
  put_bytes(what, 3, "brain.Event:2");
  return event_with(wall_time, 0, what);
}

std::string encode_scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& values) {
  std::string summary;
  for (const Scalar& v : values) {
    std::string value;
    put_bytes(value, 1, v.first);
    put_key(value, 2, kWire32);
    put_fixed(value, v.second);
    put_bytes(summary, 1, value);
  }
  std::string what;
  put_bytes(what, 5, summary);
  return event_with(wall_time, step, what);
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_key(log, 1, kWireVarint);
  put_varint(log, 1);  // SessionLog.START
  std::string what;
  put_bytes(what, 7, log);
  return event_with(wall_time, step, what);
}

std::string frame_record(const std::string& data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_fixed<uint64_t>(r, data.size());
  put_fixed<uint32_t>(r, masked_crc32c(r.data(), 8));
  r += data;
  put_fixed<uint32_t>(r, masked_crc32c(data.data(), data.size()));
  return r;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  EASYCTX_CHECK(!ec, dir, ": cannot create the TensorBoard folder: ", ec.message());
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == 0) std::strcpy(host, "localhost");
  // n tells apart two writers of one process started in the same second (a resumed run in
  // a test, or two models of one evaluation); O_EXCL keeps any other collision from sharing a file.
  static std::atomic<int> counter{0};
  const auto secs = static_cast<long long>(now_seconds());
  for (int tries = 0; fd_ < 0; ++tries) {
    path_ = (fs::path(dir) / (std::string(kFilePrefix) + std::to_string(secs) + "." + host + "." +
                              std::to_string(::getpid()) + "." + std::to_string(counter++)))
                .string();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_APPEND, 0644);
    EASYCTX_CHECK(fd_ >= 0 || (errno == EEXIST && tries < 1000), path_,
                  ": cannot create the TensorBoard event file: ", std::strerror(errno));
  }
  write_record(encode_file_version_event(now_seconds()), "file version");
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::add_scalars(int64_t step, const std::vector<Scalar>& values) {
  write_record(encode_scalars_event(now_seconds(), step, values), "scalars");
}

void EventWriter::session_start(int64_t step) {
  write_record(encode_session_start_event(now_seconds(), step), "session start");
}

void EventWriter::write_record(const std::string& event, const char* what) {
  const std::string rec = frame_record(event);
  // Whole records only, for the next reader: append_whole cuts the file back on failure.
  if (const int e = append_whole(fd_, rec))
    EASYCTX_THROW(path_, ": cannot write the TensorBoard ", what, " record: ", std::strerror(e),
                  " (free space and resume, or set logging.tensorboard: false)");
}

Event decode_event(const std::string& data, const std::string& where) {
  Reader r{data, 0, data.size(), where};
  Event e;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == kWire64) {
      e.wall_time = get_fixed<double>(r.fixed(8));
    } else if (field == 2 && wire == kWireVarint) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == kWireLen) {
      const auto [b, n] = r.length_delimited();
      e.file_version = data.substr(b, n);
    } else if (field == 5 && wire == kWireLen) {
      const auto [b, n] = r.length_delimited();
      decode_summary(data, b, n, where, e);
    } else if (field == 7 && wire == kWireLen) {
      const auto [b, n] = r.length_delimited();
      e.session_status = decode_session_status(data, b, n, where);
    } else {
      r.skip(wire);
    }
  }
  return e;
}

EventFile read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EASYCTX_CHECK_INPUT(in.good(), path, ": cannot open the event file");
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EASYCTX_CHECK_INPUT(!in.bad(), path, ": cannot read the event file");
  EventFile f;
  uint64_t pos = 0;
  while (pos < s.size()) {
    const uint64_t left = s.size() - pos;
    const std::string where = path + " (record at byte " + std::to_string(pos) + ")";
    if (left < 12) {
      f.partial_tail_bytes = left;
      break;
    }
    const char* p = s.data() + pos;
    EASYCTX_CHECK(get_fixed<uint32_t>(p + 8) == masked_crc32c(p, 8), where, ": length CRC mismatch");
    const uint64_t n = get_fixed<uint64_t>(p);
    if (n > left - 12 || n + 16 > left) {
      f.partial_tail_bytes = left;
      break;
    }
    const std::string data = s.substr(pos + 12, n);
    EASYCTX_CHECK(get_fixed<uint32_t>(p + 12 + n) == masked_crc32c(data.data(), data.size()), where,
                  ": data CRC mismatch");
    f.events.push_back(decode_event(data, where));
    pos += n + 16;
  }
  return f;
}

std::vector<std::string> list_event_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename().string().rfind(kFilePrefix, 0) == 0)
      out.push_back(e.path().string());
  EASYCTX_CHECK_INPUT(!ec, dir, ": cannot list the TensorBoard folder: ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace easyctx::tb
