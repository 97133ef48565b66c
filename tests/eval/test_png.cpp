// The PNG encoder and canvas: what is drawn comes back pixel for pixel through zlib's
// inflate; corrupt files are named.
#include <zlib.h>

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

}  // namespace
}  // namespace easyctx::test
