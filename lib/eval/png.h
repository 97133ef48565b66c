// Pictures for the evaluations (the perplexity plot, the needle heatmap): an RGB canvas with
// a tiny rasteriser (pixels, filled rectangles, lines, text in a built-in 5x7 bitmap font)
// and a PNG encoder (RGB8, filter 0, zlib's deflate, CRC32), plus a decoder of the PNGs it
// writes (and any other non-interlaced 8-bit RGB/RGBA/grey PNG) so tests can check pixels.
//
//   eval::Canvas c(640, 480);                       // white
//   c.fill_rect(10, 10, 100, 20, eval::rgb("#0CD79F"));
//   c.line(0, 479, 639, 0, {255, 0, 0}, 2);
//   c.text(12, 40, "ppl 12.5", eval::kBlack, 2);    // top-left corner, 2x scaled glyphs
//   eval::write_png("out.png", c);
//   eval::Canvas back = eval::read_png("out.png");  // back.pixel(x, y) == c.pixel(x, y)
//
// Coordinates are pixels, x to the right, y down, (0, 0) the top-left; everything drawn is
// clipped to the canvas.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace easyctx::eval {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
  bool operator!=(const Rgb& o) const { return !(*this == o); }
};

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kGrey{128, 128, 128};
constexpr Rgb kLightGrey{225, 225, 225};

// "#RRGGBB" or "RRGGBB"; InputError otherwise.
Rgb rgb(const std::string& hex);
// a + (b - a) * t per channel, t clamped to [0, 1], rounded.
Rgb mix(Rgb a, Rgb b, double t);
// A palette of distinct line colours (index modulo its size).
Rgb palette(size_t i);

// The built-in font: 5x7 glyphs in cells of 6x8 pixels (times `scale`), printable ASCII;
// any other byte draws as '?'.
constexpr int kGlyphWidth = 5, kGlyphHeight = 7, kCellWidth = 6, kCellHeight = 8;

class Canvas {
 public:
  Canvas() = default;
  Canvas(int width, int height, Rgb background = kWhite);

  int width() const { return w_; }
  int height() const { return h_; }
  // The pixel at (x, y); Error outside the canvas.
  Rgb pixel(int x, int y) const;
  void set_pixel(int x, int y, Rgb c);  // ignored outside the canvas
  // The w x h rectangle with top-left (x, y), filled; outline: its 1-pixel border only.
  void fill_rect(int x, int y, int w, int h, Rgb c);
  void rect(int x, int y, int w, int h, Rgb c);
  // A straight line from (x0, y0) to (x1, y1), both ends included (Bresenham), `thickness`
  // pixels wide (a square pen centred on the line).
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
  // Text with its top-left corner at (x, y), glyphs scaled `scale` times; '\n' starts a new
  // line. text_up draws it rotated a quarter turn counter-clockwise (reading bottom to top),
  // with (x, y) the bottom-left corner of the rotated text (for a y-axis title).
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  void text_up(int x, int y, const std::string& s, Rgb c, int scale = 1);
  // The size text() covers: the longest line's cells, the lines' cells (the last cell's
  // trailing column and row are blank).
  static int text_width(const std::string& s, int scale = 1);
  static int text_height(const std::string& s, int scale = 1);

  // Rows top to bottom, 3 bytes per pixel.
  const std::vector<uint8_t>& rgb_bytes() const { return px_; }

 private:
  int w_ = 0, h_ = 0;
  std::vector<uint8_t> px_;
};

// The PNG file's bytes (RGB8, non-interlaced, filter 0 on every row, zlib level 6).
std::string encode_png(const Canvas& c);
// Writes the PNG (atomically: a temporary name, then renamed); InputError naming the path.
void write_png(const std::string& path, const Canvas& c);
// Decodes a non-interlaced 8-bit greyscale / RGB / grey+alpha / RGBA PNG (any of the five row
// filters; alpha dropped); InputError naming `what` (e.g. the path) on anything else.
Canvas decode_png(const std::string& bytes, const std::string& what = "png");
Canvas read_png(const std::string& path);

}  // namespace easyctx::eval
