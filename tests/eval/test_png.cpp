// The PNG canvas: drawing, the encoder and decoder (every filter type and colour type the
// reader takes, made here independently with zlib), damaged files named in errors.
#include <zlib.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "core/strings.h"
#include "eval/png.h"
#include "train/train_test_util.h"

namespace easyctx::test {
namespace {

using eval::Canvas;

Canvas blank(int w, int h, uint32_t c = 0xFFFFFF) {
  Canvas k{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * static_cast<size_t>(h) * 3)};
  k.fill_rect(0, 0, w, h, c);
  return k;
}

TEST(Png, RoundTripRandomPixels) {
  TempDir dir("png");
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 5; ++trial) {
    const int w = 1 + static_cast<int>(rng() % 97), h = 1 + static_cast<int>(rng() % 61);
    Canvas c = blank(w, h);
    for (uint8_t& b : c.rgb) b = static_cast<uint8_t>(rng());
    if (trial == 0) c.fill_rect(0, 0, w, h / 2, 0x336699);  // flat areas too
    eval::write_png(dir / "a.png", c);
    const Canvas r = eval::read_png(dir / "a.png");
    ASSERT_EQ(r.w, w);
    ASSERT_EQ(r.h, h);
    EXPECT_EQ(r.rgb, c.rgb) << "trial " << trial;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a.png.tmp"));
}

TEST(Png, CompressesChartsWell) {
  TempDir dir("png-size");
  Canvas c = blank(1000, 500);
  for (int i = 0; i < 10; ++i) c.fill_rect(i * 100, 0, 100, 500, 0x101010u * static_cast<uint32_t>(i));
  eval::write_png(dir / "a.png", c);
  EXPECT_LT(std::filesystem::file_size(dir / "a.png"), 20000u) << "1.5 MB of flat colour";
}

// PNG bytes of `px` (channels 1..4, 8-bit) with each row filtered by filters[y % n], written
// with zlib here: the reader must undo every filter.
std::string encode_png(int w, int h, int colour, int channels, const std::vector<uint8_t>& px,
                       const std::vector<int>& filters) {
  const size_t stride = static_cast<size_t>(w) * static_cast<size_t>(channels);
  std::string raw;
  for (int y = 0; y < h; ++y) {
    const int f = filters[static_cast<size_t>(y) % filters.size()];
    raw.push_back(static_cast<char>(f));
    for (size_t i = 0; i < stride; ++i) {
      const int x = px[y * stride + i];
      const int a = i >= static_cast<size_t>(channels) ? px[y * stride + i - channels] : 0;
      const int b = y ? px[(y - 1) * stride + i] : 0;
      const int c = y && i >= static_cast<size_t>(channels) ? px[(y - 1) * stride + i - channels] : 0;
      int pred = 0;
      if (f == 1) pred = a;
      if (f == 2) pred = b;
      if (f == 3) pred = (a + b) >> 1;
      if (f == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      raw.push_back(static_cast<char>((x - pred) & 0xFF));
    }
  }
  uLongf zlen = compressBound(raw.size());
  std::string z(zlen, '\0');
  compress2(reinterpret_cast<Bytef*>(&z[0]), &zlen, reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 6);
  z.resize(zlen);
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  auto chunk = [&](const std::string& type, const std::string& data) {
    std::string td = type + data;
    return be32(static_cast<uint32_t>(data.size())) + td +
           be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(td.data()), td.size())));
  };
  std::string ihdr = be32(static_cast<uint32_t>(w)) + be32(static_cast<uint32_t>(h));
  ihdr += std::string{8, static_cast<char>(colour), 0, 0, 0};
  // Two IDAT chunks: the reader joins them.
  const size_t half = z.size() / 2;
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("tEXt", std::string("Comment\0x", 9)) +
         chunk("IDAT", z.substr(0, half)) + chunk("IDAT", z.substr(half)) + chunk("IEND", "");
}

TEST(Png, ReadsEveryFilterAndColourType) {
  TempDir dir("png-filters");
  std::mt19937_64 rng(test_seed());
  const int w = 23, h = 17;
  for (int colour : {0, 2, 4, 6}) {
    const int channels = colour == 0 ? 1 : colour == 2 ? 3 : colour == 4 ? 2 : 4;
    std::vector<uint8_t> px(static_cast<size_t>(w * h * channels));
    for (uint8_t& b : px) b = static_cast<uint8_t>(rng() % 7 == 0 ? 200 : rng());
    write_file_atomic(dir / "f.png", encode_png(w, h, colour, channels, px, {0, 1, 2, 3, 4, 4, 3}));
    const Canvas c = eval::read_png(dir / "f.png");
    ASSERT_EQ(c.w, w);
    ASSERT_EQ(c.h, h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const uint8_t* q = &px[static_cast<size_t>((y * w + x) * channels)];
        const uint32_t want = channels >= 3 ? (uint32_t{q[0]} << 16 | uint32_t{q[1]} << 8 | q[2])
                                            : (uint32_t{q[0]} * 0x010101u);
        ASSERT_EQ(c.get(x, y), want) << "colour type " << colour << " at " << x << "," << y;
      }
  }
}

TEST(Png, DamagedFilesAreNamed) {
  TempDir dir("png-bad");
  eval::write_png(dir / "ok.png", blank(8, 8, 0x123456));
  std::string bytes = read_file(dir / "ok.png");
  auto expect_named = [&](const std::string& name, const std::string& content, const std::string& what) {
    write_file_atomic(dir / name, content);
    try {
      eval::read_png(dir / name);
      ADD_FAILURE() << name << " was read";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_named("text.png", "hello, not a png", "signature");
  std::string flipped = bytes;
  flipped[45] = static_cast<char>(flipped[45] ^ 0x40);  // inside IDAT's data
  expect_named("crc.png", flipped, "CRC");
  expect_named("short.png", bytes.substr(0, bytes.size() - 20), "");
  EXPECT_THROW(eval::read_png(dir / "missing.png"), InputError);
}

TEST(Canvas, DrawsAndClips) {
  Canvas c = blank(20, 10);
  c.fill_rect(-5, -5, 10, 10, 0xFF0000);  // clipped to [0,5) x [0,5)
  EXPECT_EQ(c.get(0, 0), 0xFF0000u);
  EXPECT_EQ(c.get(4, 4), 0xFF0000u);
  EXPECT_EQ(c.get(5, 4), 0xFFFFFFu);
  c.set(100, 100, 0);  // outside: ignored
  c.line(0, 9, 19, 9, 0x00FF00);
  for (int x = 0; x < 20; ++x) EXPECT_EQ(c.get(x, 9), 0x00FF00u);
  c.line(19, 0, 10, 9, 0x0000FF);  // a diagonal, both ends included
  EXPECT_EQ(c.get(19, 0), 0x0000FFu);
  EXPECT_EQ(c.get(10, 9), 0x0000FFu);
  EXPECT_EQ(c.get(15, 4), 0x0000FFu);
  EXPECT_THROW(c.get(20, 0), Error);
}

TEST(Canvas, TextGlyphs) {
  // 'L' at scale 1: the left column and the bottom row of its 5x7 box.
  Canvas c = blank(12, 9);
  c.text(1, 1, "L", 0x000000);
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 5; ++x) {
      const bool ink = x == 0 || y == 6;
      EXPECT_EQ(c.get(1 + x, 1 + y), ink ? 0u : 0xFFFFFFu) << x << "," << y;
    }
  // Scale 2: each pixel a 2x2 square; the next glyph 12 pixels on.
  Canvas d = blank(30, 16);
  d.text(0, 0, "LL", 0x000000, 2);
  EXPECT_EQ(d.get(0, 13), 0u);
  EXPECT_EQ(d.get(1, 12), 0u);
  EXPECT_EQ(d.get(12, 0), 0u);
  EXPECT_EQ(d.get(11, 0), 0xFFFFFFu);
  EXPECT_EQ(eval::text_width("LL", 2), 22);
  EXPECT_EQ(eval::text_height("a\nb", 1), 15);
  // Every printable character has ink except the space; others draw as '?'.
  for (int ch = 33; ch < 127; ++ch) {
    Canvas g = blank(6, 8);
    g.text(0, 0, std::string(1, static_cast<char>(ch)), 0);
    EXPECT_NE(std::count(g.rgb.begin(), g.rgb.end(), 0), 0) << "no ink for '" << static_cast<char>(ch) << "'";
  }
  Canvas q = blank(6, 8), u = blank(6, 8);
  q.text(0, 0, "?", 0);
  u.text(0, 0, "\x01", 0);
  EXPECT_EQ(q.rgb, u.rgb);
}

}  // namespace
}  // namespace easyctx::test
