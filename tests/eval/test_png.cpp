// The PNG encoder and canvas: what is drawn comes back pixel for pixel through zlib's
// inflate; the decoder undoes every row filter and colour type of PNGs made here
// independently with zlib; corrupt files are named.
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/strings.h"
#include "eval/png.h"
#include "train/train_test_util.h"

namespace easyctx::test {
namespace {

using eval::Canvas;
using eval::Rgb;

TEST(Png, RoundTripEveryPixel) {
  std::mt19937_64 rng(test_seed());
  Canvas c(37, 23, eval::rgb("#102030"));
  for (int i = 0; i < 200; ++i)
    c.set_pixel(static_cast<int>(rng() % 37), static_cast<int>(rng() % 23),
                {static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng())});
  TempDir dir("png");
  eval::write_png(dir / "a.png", c);
  const Canvas back = eval::read_png(dir / "a.png");
  ASSERT_EQ(back.width(), 37);
  ASSERT_EQ(back.height(), 23);
  EXPECT_EQ(back.rgb_bytes(), c.rgb_bytes());
}

TEST(Png, ShapesLandWhereAsked) {
  Canvas c(50, 40);
  const Rgb red = eval::rgb("#F0496E"), green = eval::rgb("0CD79F");
  c.fill_rect(5, 6, 4, 3, red);
  c.line(0, 30, 49, 30, green);
  c.line(10, 0, 10, 39, eval::kBlack, 3);  // columns 9..11
  c.fill_rect(45, 35, 20, 20, red);        // clipped
  const Canvas b = eval::decode_png(eval::encode_png(c));
  EXPECT_EQ(b.pixel(5, 6), red);
  EXPECT_EQ(b.pixel(8, 8), red);
  EXPECT_EQ(b.pixel(4, 6), eval::kWhite);
  EXPECT_EQ(b.pixel(9, 6), eval::kBlack);
  EXPECT_EQ(b.pixel(12, 6), eval::kWhite);
  EXPECT_EQ(b.pixel(0, 30), green);
  EXPECT_EQ(b.pixel(49, 30), green);
  EXPECT_EQ(b.pixel(11, 30), eval::kBlack);  // drawn after the green line
  EXPECT_EQ(b.pixel(49, 39), red);
  EXPECT_EQ(eval::mix(eval::kBlack, eval::kWhite, 0.5), (Rgb{128, 128, 128}));
}

TEST(Png, TextUsesTheFont) {
  Canvas c(200, 30);
  c.text(2, 2, "1M ppl", eval::kBlack, 2);
  EXPECT_EQ(Canvas::text_width("1M ppl", 2), 6 * 6 * 2);
  EXPECT_EQ(Canvas::text_height("a\nb", 1), 16);
  // '1' is {0x00, 0x42, 0x7F, 0x40, 0x00}: column 2 is fully set, column 0 empty.
  for (int row = 0; row < 7; ++row) {
    EXPECT_EQ(c.pixel(2 + 2 * 2, 2 + 2 * row), eval::kBlack) << row;
    EXPECT_EQ(c.pixel(2, 2 + 2 * row), eval::kWhite) << row;
  }
  int inked = 0;
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 200; ++x) inked += c.pixel(x, y) == eval::kBlack;
  EXPECT_GT(inked, 100);
  Canvas up(30, 60);
  up.text_up(2, 50, "1", eval::kBlack);
  for (int row = 0; row < 7; ++row) EXPECT_EQ(up.pixel(2 + row, 50 - 3), eval::kBlack) << row;  // column 2 of '1'
}

TEST(Png, FileIsAPlainPng) {
  Canvas c(3, 2, {1, 2, 3});
  const std::string s = eval::encode_png(c);
  ASSERT_GT(s.size(), 8u + 25 + 12);
  EXPECT_EQ(s.substr(1, 3), "PNG");
  EXPECT_EQ(s.substr(12, 4), "IHDR");
  // The IDAT payload inflates to rows of filter byte 0 + RGB.
  const size_t idat = s.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  const uint32_t len = (uint32_t(uint8_t(s[idat - 4])) << 24) | (uint32_t(uint8_t(s[idat - 3])) << 16) |
                       (uint32_t(uint8_t(s[idat - 2])) << 8) | uint8_t(s[idat - 1]);
  std::vector<uint8_t> raw(2 * (1 + 9));
  uLongf rl = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &rl, reinterpret_cast<const Bytef*>(s.data() + idat + 4), len), Z_OK);
  EXPECT_EQ(raw, (std::vector<uint8_t>{0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 0, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
}

TEST(Png, CorruptFilesAreNamed) {
  std::string s = eval::encode_png(Canvas(4, 4));
  s[20] ^= 1;  // inside IHDR: its CRC no longer matches
  try {
    eval::decode_png(s, "pic.png");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pic.png"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
  EXPECT_THROW(eval::decode_png("GIF89a", "x.gif"), InputError);
  EXPECT_THROW(eval::rgb("#12345"), InputError);
}

// PNG bytes of `px` (channels 1..4, 8-bit) with each row filtered by filters[y % n], made here
// with zlib and split over two IDAT chunks after a tEXt chunk: the reader must undo every
// filter, join the IDATs and skip chunks it does not know.
std::string independent_png(int w, int h, int colour, int channels, const std::vector<uint8_t>& px,
                            const std::vector<int>& filters) {
  const size_t stride = static_cast<size_t>(w) * static_cast<size_t>(channels);
  std::string raw;
  for (int y = 0; y < h; ++y) {
    const int f = filters[static_cast<size_t>(y) % filters.size()];
    raw.push_back(static_cast<char>(f));
    for (size_t i = 0; i < stride; ++i) {
      const size_t row = static_cast<size_t>(y) * stride;
      const int x = px[row + i];
      const int a = i >= static_cast<size_t>(channels) ? px[row + i - channels] : 0;
      const int b = y ? px[row - stride + i] : 0;
      const int c = y && i >= static_cast<size_t>(channels) ? px[row - stride + i - channels] : 0;
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
    const std::string td = type + data;
    return be32(static_cast<uint32_t>(data.size())) + td +
           be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(td.data()), td.size())));
  };
  std::string ihdr = be32(static_cast<uint32_t>(w)) + be32(static_cast<uint32_t>(h));
  ihdr += std::string{8, static_cast<char>(colour), 0, 0, 0};
  const size_t half = z.size() / 2;
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("tEXt", std::string("Comment\0x", 9)) +
         chunk("IDAT", z.substr(0, half)) + chunk("IDAT", z.substr(half)) + chunk("IEND", "");
}

TEST(Png, ReadsEveryFilterAndColourType) {
  std::mt19937_64 rng(test_seed());
  const int w = 23, h = 17;
  for (int colour : {0, 2, 4, 6}) {
    const int channels = colour == 0 ? 1 : colour == 2 ? 3 : colour == 4 ? 2 : 4;
    std::vector<uint8_t> px(static_cast<size_t>(w * h * channels));
    for (uint8_t& b : px) b = static_cast<uint8_t>(rng() % 7 == 0 ? 200 : rng());
    const Canvas c = eval::decode_png(independent_png(w, h, colour, channels, px, {0, 1, 2, 3, 4, 4, 3}), "f.png");
    ASSERT_EQ(c.width(), w);
    ASSERT_EQ(c.height(), h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const uint8_t* q = &px[static_cast<size_t>((y * w + x) * channels)];
        const Rgb want = channels >= 3 ? Rgb{q[0], q[1], q[2]} : Rgb{q[0], q[0], q[0]};
        ASSERT_EQ(c.pixel(x, y), want) << "colour type " << colour << " at " << x << "," << y;
      }
  }
}

TEST(Png, DamagedFilesAreNamed) {
  TempDir dir("png-bad");
  eval::write_png(dir / "ok.png", Canvas(8, 8, eval::rgb("#123456")));
  EXPECT_FALSE(std::filesystem::exists(dir / "ok.png.tmp"));
  const std::string bytes = read_file(dir / "ok.png");
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

TEST(Png, EveryGlyphHasInk) {
  // Every printable character but the space leaves ink; any other byte draws as '?'.
  for (int ch = 33; ch < 127; ++ch) {
    Canvas g(6, 8);
    g.text(0, 0, std::string(1, static_cast<char>(ch)), eval::kBlack);
    EXPECT_NE(std::count(g.rgb_bytes().begin(), g.rgb_bytes().end(), 0), 0)
        << "no ink for '" << static_cast<char>(ch) << "'";
  }
  Canvas q(6, 8), u(6, 8);
  q.text(0, 0, "?", eval::kBlack);
  u.text(0, 0, "\x01", eval::kBlack);
  EXPECT_EQ(q.rgb_bytes(), u.rgb_bytes());
}

}  // namespace
}  // namespace easyctx::test
