// PNG images without a plotting library: an RGB canvas to draw on (rectangles, lines, text
// in a built-in 5x7 bitmap font) and a PNG encoder/decoder over zlib. The evaluations draw
// their charts with it (the needle heatmap: eval/heatmap.h); tests read the files back to
// check the pixels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace easyctx::eval {

// w x h pixels, row-major, 3 bytes (R, G, B) per pixel: rgb.size() == w * h * 3. Colours are
// 0xRRGGBB. Drawing outside the canvas is clipped.
//   Canvas c{w, h, std::vector<uint8_t>(size_t(w) * h * 3, 255)};  // white
struct Canvas {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;

  void set(int x, int y, uint32_t rgb);
  uint32_t get(int x, int y) const;  // 0xRRGGBB; throws Error outside the canvas
  void fill_rect(int x, int y, int w, int h, uint32_t rgb);
  void line(int x0, int y0, int x1, int y1, uint32_t rgb);  // both ends included (Bresenham)
  // ASCII text from its top-left corner: 5x7 glyphs on a 6x8 grid, each pixel a scale x
  // scale square; other characters are drawn as '?'. A '\n' starts a new line.
  void text(int x, int y, const std::string& s, uint32_t rgb, int scale = 1);
};

// Size in pixels of text(s, ..., scale): {width, height} of its bounding box.
int text_width(const std::string& s, int scale = 1);
int text_height(const std::string& s, int scale = 1);

// 8-bit RGB, not interlaced, zlib level 9. Written to a temporary name and renamed, so a
// reader never sees half a file. Throws Error naming the path when it cannot be written.
void write_png(const std::string& path, const Canvas& c);

// Reads 8-bit greyscale, grey+alpha, RGB or RGBA PNGs (alpha dropped), not interlaced; every
// chunk's CRC is checked. Throws InputError naming the file and what is wrong.
Canvas read_png(const std::string& path);

}  // namespace easyctx::eval
