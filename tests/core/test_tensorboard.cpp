// TensorBoard event files (core/tensorboard.h): CRC-32C against its published check values,
// the protobuf and TFRecord bytes against hand-encoded ones, and random events written by
// EventWriter read back with every CRC checked; corruption is an error, a cut-off last
// record is skipped, a full file system is an error naming the file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/strings.h"
#include "dist/runtime.h"
#include "tensorboard_test_util.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : s) h += std::string{d[c >> 4], d[c & 15]};
  return h;
}

std::string scratch(const std::string& tag) {
  const std::string p =
      "/tmp/easyctx-tb-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(test_seed() % 100000);
  fs::remove_all(p);
  return p;
}

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(tb::crc32c("123456789", 9), 0xe3069283u);  // the CRC catalogue's check value
  // RFC 3720 (iSCSI) B.4 test vectors
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(tb::crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(tb::crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(tb::crc32c(inc.data(), inc.size()), 0x46dd794eu);
  EXPECT_EQ(tb::crc32c("", 0), 0u);
  // Continuing a CRC over a split equals one pass.
  EXPECT_EQ(tb::crc32c("56789", 5, tb::crc32c("1234", 4)), 0xe3069283u);
  // mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, by hand for the check value.
  EXPECT_EQ(tb::masked_crc32c("123456789", 9), 0xc78ab0e5u);
}

TEST(TensorBoardEncoding, VarintsAndKeys) {
  auto v = [](uint64_t x) {
    std::string s;
    tb::put_varint(s, x);
    return hex(s);
  };
  EXPECT_EQ(v(0), "00");
  EXPECT_EQ(v(1), "01");
  EXPECT_EQ(v(127), "7f");
  EXPECT_EQ(v(128), "8001");
  EXPECT_EQ(v(300), "ac02");
  EXPECT_EQ(v(16384), "808001");
  EXPECT_EQ(v(static_cast<uint64_t>(int64_t{-1})), "ffffffffffffffffff01");  // int64 -1: ten bytes
  std::string k;
  tb::put_key(k, 5, 2);
  EXPECT_EQ(hex(k), "2a");  // Event.summary: field 5, length-delimited
}

TEST(TensorBoardEncoding, ScalarEventBytesByHand) {
  // wall_time 1.5 (09 + fixed64), step 300 (10 + varint ac 02), summary (2a 0a) holding one
  // Value (0a 08) of tag "a" (0a 01 61) and simple_value 1.0f (15 + fixed32 0000803f).
  const std::string want = bytes({0x09, 0,    0,    0,    0,    0,    0,    0xf8, 0x3f, 0x10, 0xac, 0x02,
                                  0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 0x61, 0x15, 0,    0,    0x80, 0x3f});
  EXPECT_EQ(hex(tb::encode_scalars_event(1.5, 300, {{"a", 1.0f}})), hex(want));
  EXPECT_EQ(hex(tb::encode_file_version_event(2.0)), "0900000000000000401a0d627261696e2e4576656e743a32");
  // SessionLog START at step 7: field 7 (3a), length 2, status (08) = 1.
  EXPECT_EQ(hex(tb::encode_session_start_event(2.0, 7)),
            "0900000000000000401007"
            "3a020801");
  // The framing: length 24 (u64 LE), masked CRCs of the length bytes and of the data
  // (computed for these bytes with an independent bitwise CRC-32C).
  const std::string rec = tb::frame_record(want);
  ASSERT_EQ(rec.size(), want.size() + 16);
  EXPECT_EQ(hex(rec.substr(0, 12)),
            "1800000000000000"
            "a37f4b22");
  EXPECT_EQ(rec.substr(12, want.size()), want);
  EXPECT_EQ(hex(rec.substr(12 + want.size())), "e3d5970b");
  const tb::Event e = tb::decode_event(want, "hand");
  EXPECT_EQ(e.wall_time, 1.5);
  EXPECT_EQ(e.step, 300);
  ASSERT_EQ(e.values.size(), 1u);
  EXPECT_EQ(e.values[0].first, "a");
  EXPECT_EQ(e.values[0].second, 1.0f);
}

TEST(TensorBoardWriter, RandomEventsReadBackExactly) {
  const uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  const std::string dir = scratch("rand") + "/nested/tb";
  const double t0 = unix_now();
  std::vector<std::pair<int64_t, std::vector<tb::Scalar>>> written;
  std::string path;
  {
    tb::EventWriter w(dir);  // creates the folders
    path = w.path();
    int64_t step = static_cast<int64_t>(rng() % 1000);
    const int events = 5 + static_cast<int>(rng() % 40);
    for (int i = 0; i < events; ++i) {
      std::vector<tb::Scalar> vals;
      const int n = 1 + static_cast<int>(rng() % 6);
      for (int k = 0; k < n; ++k) {
        std::string tag = "t" + std::to_string(k) + "/";
        for (int c = static_cast<int>(rng() % 300); c > 0; --c) tag.push_back(static_cast<char>('a' + rng() % 26));
        uint32_t bits = static_cast<uint32_t>(rng());
        float f;
        std::memcpy(&f, &bits, 4);
        if (!std::isfinite(f)) f = std::ldexp(static_cast<float>(rng() % 1000), -static_cast<int>(rng() % 40));
        vals.emplace_back(tag, f);
      }
      step += static_cast<int64_t>(rng() % 100000) + 1;  // steps past 2^14 and 2^21: longer varints
      w.add_scalars(step, vals);
      written.emplace_back(step, vals);
      // The file is readable while the writer is open (what a live viewer sees).
      EXPECT_EQ(tb::read_event_file(path).events.size(), static_cast<size_t>(i) + 2);
    }
  }
  const std::string name = fs::path(path).filename().string();
  EXPECT_TRUE(starts_with(name, "events.out.tfevents.")) << name;
  EXPECT_TRUE(ends_with(name, "." + std::to_string(::getpid()) + "." + split(name, '.').back())) << name;
  const tb::EventFile f = tb::read_event_file(path);
  ASSERT_EQ(f.events.size(), written.size() + 1) << "seed " << seed;
  EXPECT_EQ(f.events[0].file_version, "brain.Event:2");
  double last = t0;
  for (size_t i = 0; i < f.events.size(); ++i) {
    EXPECT_GE(f.events[i].wall_time, last);
    last = f.events[i].wall_time;
    if (i == 0) continue;
    EXPECT_EQ(f.events[i].step, written[i - 1].first);
    ASSERT_EQ(f.events[i].values.size(), written[i - 1].second.size());
    for (size_t k = 0; k < written[i - 1].second.size(); ++k) {
      EXPECT_EQ(f.events[i].values[k].first, written[i - 1].second[k].first);
      EXPECT_EQ(std::memcmp(&f.events[i].values[k].second, &written[i - 1].second[k].second, 4), 0)
          << "seed " << seed << " event " << i << " value " << k;
    }
  }
  EXPECT_LE(last, unix_now());
  fs::remove_all(fs::path(dir).parent_path().parent_path());
}

TEST(TensorBoardWriter, CorruptionIsAnErrorAndACutTailIsSkipped) {
  std::mt19937_64 rng(test_seed());
  const std::string dir = scratch("corrupt");
  std::string path;
  {
    tb::EventWriter w(dir);
    path = w.path();
    for (int i = 1; i <= 4; ++i) w.add_scalar("loss", i, static_cast<float>(rng() % 1000) / 7.0f);
  }
  const std::string good = read_file(path);
  // A record cut anywhere inside: the whole records before it are read, the rest skipped.
  const tb::EventFile whole = tb::read_event_file(path);
  ASSERT_EQ(whole.events.size(), 5u);
  const size_t cut = good.size() - 1 - rng() % 30;
  write_file_atomic(path, good.substr(0, cut));
  const tb::EventFile f = tb::read_event_file(path);
  EXPECT_EQ(f.events.size(), 4u);
  size_t last_start = 0;  // where the last record begins (walking the lengths by hand)
  for (size_t pos = 0; pos < good.size();) {
    uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<unsigned char>(good[pos + static_cast<size_t>(k)]);
    last_start = pos;
    pos += static_cast<size_t>(n) + 16;
  }
  ASSERT_GT(cut, last_start);
  EXPECT_EQ(f.partial_tail_bytes, cut - last_start);
  // Any flipped byte of a record is caught by one of its two CRCs.
  const size_t at = rng() % good.size();
  std::string bad = good;
  bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
  write_file_atomic(path, bad);
  try {
    (void)tb::read_event_file(path);
    ADD_FAILURE() << "flipped byte " << at << " not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC mismatch"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, FileSizeLimitIsAnErrorNamingTheFileAndLeavesWholeRecords) {
  const std::string dir = scratch("efbig");
  std::string path, msg;
  const pid_t pid = ::fork();  // the limit in a child: the test process keeps its own
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dist::ignore_file_size_signal();  // as every program does first (dist::run_main)
    rlimit r{1000, 1000};
    ::setrlimit(RLIMIT_FSIZE, &r);
    int rc = 3;
    try {
      tb::EventWriter w(dir);
      for (int i = 1; i < 1000; ++i) w.add_scalars(i, {{"train/loss", 1.0f / static_cast<float>(i)}, {"x", 2.0f}});
    } catch (const Error& e) {
      std::ofstream(dir + "/error.txt") << e.what();
      rc = 0;
    }
    std::_Exit(rc);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "no error at the file-size limit";
  const std::vector<std::string> files = tb::list_event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  msg = read_file(dir + "/error.txt");
  EXPECT_NE(msg.find(files[0] + ": cannot write the TensorBoard scalars record: File too large"), std::string::npos)
      << msg;
  const tb::EventFile f = tb::read_event_file(files[0]);
  EXPECT_EQ(f.partial_tail_bytes, 0u);
  EXPECT_GE(f.events.size(), 10u);
  EXPECT_LE(fs::file_size(files[0]), 1000u);
  for (size_t i = 1; i < f.events.size(); ++i) EXPECT_EQ(f.events[i].step, static_cast<int64_t>(i));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace easyctx::test
