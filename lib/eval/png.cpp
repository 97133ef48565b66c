#include "eval/png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::eval {
namespace {

// The classic 5x7 LCD font, printable ASCII 0x20..0x7E: 5 columns per glyph, bit r of a
// column is row r (0 = top).
const uint8_t kFont[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00},
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62},
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00},
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08},
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00},
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00},
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10},
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03},
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00},
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14},
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3E},
    {0x7E, 0x11, 0x11, 0x11, 0x7E}, {0x7F, 0x49, 0x49, 0x49, 0x36}, {0x3E, 0x41, 0x41, 0x41, 0x22},
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, {0x7F, 0x49, 0x49, 0x49, 0x41}, {0x7F, 0x09, 0x09, 0x09, 0x01},
    {0x3E, 0x41, 0x49, 0x49, 0x7A}, {0x7F, 0x08, 0x08, 0x08, 0x7F}, {0x00, 0x41, 0x7F, 0x41, 0x00},
    {0x20, 0x40, 0x41, 0x3F, 0x01}, {0x7F, 0x08, 0x14, 0x22, 0x41}, {0x7F, 0x40, 0x40, 0x40, 0x40},
    {0x7F, 0x02, 0x0C, 0x02, 0x7F}, {0x7F, 0x04, 0x08, 0x10, 0x7F}, {0x3E, 0x41, 0x41, 0x41, 0x3E},
    {0x7F, 0x09, 0x09, 0x09, 0x06}, {0x3E, 0x41, 0x51, 0x21, 0x5E}, {0x7F, 0x09, 0x19, 0x29, 0x46},
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7F, 0x01, 0x01}, {0x3F, 0x40, 0x40, 0x40, 0x3F},
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, {0x3F, 0x40, 0x38, 0x40, 0x3F}, {0x63, 0x14, 0x08, 0x14, 0x63},
    {0x07, 0x08, 0x70, 0x08, 0x07}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7F, 0x41, 0x41, 0x00},
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7F, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04},
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78},
    {0x7F, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7F},
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x0C, 0x52, 0x52, 0x52, 0x3E},
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3D, 0x00},
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78},
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7C, 0x14, 0x14, 0x14, 0x08},
    {0x08, 0x14, 0x14, 0x18, 0x7C}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20},
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C},
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0C, 0x50, 0x50, 0x50, 0x3C},
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00},
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},
};

const uint8_t* glyph(char ch) {
  const unsigned char u = static_cast<unsigned char>(ch);
  return kFont[(u >= 0x20 && u <= 0x7E) ? u - 0x20 : '?' - 0x20];
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put_u32(out, static_cast<uint32_t>(
                   crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

const char kSignature[] = "\x89PNG\r\n\x1a\n";

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

}  // namespace

Rgb rgb(const std::string& hex) {
  const std::string h = (!hex.empty() && hex[0] == '#') ? hex.substr(1) : hex;
  bool ok = h.size() == 6;
  for (char c : h) ok = ok && hex_digit(c) >= 0;
  EASYCTX_CHECK_INPUT(ok, "colour '", hex, "': expected #RRGGBB");
  auto byte = [&](size_t i) { return static_cast<uint8_t>(hex_digit(h[i]) * 16 + hex_digit(h[i + 1])); };
  return {byte(0), byte(2), byte(4)};
}

Rgb mix(Rgb a, Rgb b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  auto ch = [&](uint8_t x, uint8_t y) { return static_cast<uint8_t>(std::lround(x + (y - x) * t)); };
  return {ch(a.r, b.r), ch(a.g, b.g), ch(a.b, b.b)};
}

Rgb palette(size_t i) {
  static const Rgb p[] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44}, {148, 103, 189},
                          {255, 127, 14}, {23, 190, 207}, {140, 86, 75}, {227, 119, 194}};
  return p[i % (sizeof p / sizeof p[0])];
}

Canvas::Canvas(int width, int height, Rgb background) : w_(width), h_(height) {
  EASYCTX_CHECK(width > 0 && height > 0 && width <= (1 << 15) && height <= (1 << 15), "Canvas: size ", width, "x",
                height, " (each side must be 1..32768)");
  px_.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = background.r;
    px_[i + 1] = background.g;
    px_[i + 2] = background.b;
  }
}

Rgb Canvas::pixel(int x, int y) const {
  EASYCTX_CHECK(x >= 0 && y >= 0 && x < w_ && y < h_, "Canvas::pixel: (", x, ", ", y, ") is outside ", w_, "x", h_);
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void Canvas::set_pixel(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void Canvas::fill_rect(int x, int y, int w, int h, Rgb c) {
  const int x0 = std::max(0, x), y0 = std::max(0, y), x1 = std::min(w_, x + w), y1 = std::min(h_, y + h);
  for (int yy = y0; yy < y1; ++yy)
    for (int xx = x0; xx < x1; ++xx) set_pixel(xx, yy, c);
}

void Canvas::rect(int x, int y, int w, int h, Rgb c) {
  if (w <= 0 || h <= 0) return;
  fill_rect(x, y, w, 1, c);
  fill_rect(x, y + h - 1, w, 1, c);
  fill_rect(x, y, 1, h, c);
  fill_rect(x + w - 1, y, 1, h, c);
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  const int t = std::max(1, thickness), lo = -(t - 1) / 2;
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    if (t == 1) set_pixel(x0, y0, c);
    else fill_rect(x0 + lo, y0 + lo, t, t, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  const int k = std::max(1, scale);
  int cx = x, cy = y;
  for (char ch : s) {
    if (ch == '\n') {
      cx = x;
      cy += kCellHeight * k;
      continue;
    }
    const uint8_t* g = glyph(ch);
    for (int col = 0; col < kGlyphWidth; ++col)
      for (int row = 0; row < kGlyphHeight; ++row)
        if (g[col] >> row & 1) fill_rect(cx + col * k, cy + row * k, k, k, c);
    cx += kCellWidth * k;
  }
}

void Canvas::text_up(int x, int y, const std::string& s, Rgb c, int scale) {
  const int k = std::max(1, scale);
  int cx = x, cy = y;  // along the text: up; across: right
  for (char ch : s) {
    if (ch == '\n') {
      cy = y;
      cx += kCellHeight * k;
      continue;
    }
    const uint8_t* g = glyph(ch);
    for (int col = 0; col < kGlyphWidth; ++col)
      for (int row = 0; row < kGlyphHeight; ++row)
        if (g[col] >> row & 1) fill_rect(cx + row * k, cy - (col + 1) * k, k, k, c);
    cy -= kCellWidth * k;
  }
}

int Canvas::text_width(const std::string& s, int scale) {
  size_t longest = 0, cur = 0;
  for (char ch : s) {
    cur = ch == '\n' ? 0 : cur + 1;
    longest = std::max(longest, cur);
  }
  return static_cast<int>(longest) * kCellWidth * std::max(1, scale);
}

int Canvas::text_height(const std::string& s, int scale) {
  const int lines = 1 + static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  return lines * kCellHeight * std::max(1, scale);
}

std::string encode_png(const Canvas& c) {
  EASYCTX_CHECK(c.width() > 0 && c.height() > 0, "encode_png: empty canvas");
  const size_t row = static_cast<size_t>(c.width()) * 3;
  std::string raw;
  raw.reserve((row + 1) * static_cast<size_t>(c.height()));
  const std::vector<uint8_t>& px = c.rgb_bytes();
  for (int y = 0; y < c.height(); ++y) {
    raw.push_back('\0');  // filter 0: none
    raw.append(reinterpret_cast<const char*>(px.data()) + static_cast<size_t>(y) * row, row);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
                           static_cast<uLong>(raw.size()), 6);
  EASYCTX_CHECK(rc == Z_OK, "encode_png: zlib compress2 failed (", rc, ")");
  z.resize(zlen);
  std::string out(kSignature, 8);
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(c.width()));
  put_u32(ihdr, static_cast<uint32_t>(c.height()));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, filter method 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

void write_png(const std::string& path, const Canvas& c) { write_file_atomic(path, encode_png(c)); }

Canvas decode_png(const std::string& s, const std::string& what) {
  EASYCTX_CHECK_INPUT(s.size() >= 8 && s.compare(0, 8, std::string(kSignature, 8)) == 0, what,
                      ": not a PNG file (bad signature)");
  size_t at = 8;
  uint32_t w = 0, h = 0;
  int channels = 0;
  std::string z;
  bool have_header = false, ended = false;
  while (at + 12 <= s.size() && !ended) {
    const uint32_t len = get_u32(s, at);
    EASYCTX_CHECK_INPUT(at + 12 + len <= s.size(), what, ": truncated chunk at byte ", at);
    const std::string type = s.substr(at + 4, 4);
    const uint32_t crc = get_u32(s, at + 8 + len);
    const uint32_t want =
        static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(s.data() + at + 4), static_cast<uInt>(len + 4)));
    EASYCTX_CHECK_INPUT(crc == want, what, ": CRC mismatch in chunk ", type);
    const std::string data = s.substr(at + 8, len);
    if (type == "IHDR") {
      EASYCTX_CHECK_INPUT(len == 13, what, ": IHDR of ", len, " bytes");
      w = get_u32(data, 0);
      h = get_u32(data, 4);
      const int depth = static_cast<uint8_t>(data[8]), ctype = static_cast<uint8_t>(data[9]);
      const int interlace = static_cast<uint8_t>(data[12]);
      channels = ctype == 0 ? 1 : ctype == 2 ? 3 : ctype == 4 ? 2 : ctype == 6 ? 4 : 0;
      EASYCTX_CHECK_INPUT(depth == 8 && channels > 0 && interlace == 0, what, ": unsupported PNG (bit depth ", depth,
                          ", colour type ", ctype, ", interlace ", interlace, "): 8-bit grey/RGB/RGBA only");
      EASYCTX_CHECK_INPUT(w > 0 && h > 0 && w <= (1u << 15) && h <= (1u << 15), what, ": size ", w, "x", h);
      have_header = true;
    } else if (type == "IDAT") {
      z += data;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  EASYCTX_CHECK_INPUT(have_header && ended, what, ": missing IHDR or IEND");
  const size_t stride = static_cast<size_t>(w) * static_cast<size_t>(channels);
  std::string raw((stride + 1) * h, '\0');
  uLongf rlen = static_cast<uLongf>(raw.size());
  const int rc = uncompress(reinterpret_cast<Bytef*>(raw.data()), &rlen, reinterpret_cast<const Bytef*>(z.data()),
                            static_cast<uLong>(z.size()));
  EASYCTX_CHECK_INPUT(rc == Z_OK && rlen == raw.size(), what, ": bad image data (zlib ", rc, ", ", rlen, " of ",
                      raw.size(), " bytes)");
  std::vector<uint8_t> cur(stride), prev(stride, 0);
  Canvas out(static_cast<int>(w), static_cast<int>(h));
  const size_t bpp = static_cast<size_t>(channels);
  for (uint32_t y = 0; y < h; ++y) {
    const uint8_t* in = reinterpret_cast<const uint8_t*>(raw.data()) + y * (stride + 1);
    const int filter = in[0];
    EASYCTX_CHECK_INPUT(filter <= 4, what, ": row ", y, " has filter type ", filter);
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= bpp ? cur[i - bpp] : 0, b = prev[i], c = i >= bpp ? prev[i - bpp] : 0;
      int p = 0;
      switch (filter) {
        case 1: p = a; break;
        case 2: p = b; break;
        case 3: p = (a + b) / 2; break;
        case 4: p = paeth(a, b, c); break;
        default: break;
      }
      cur[i] = static_cast<uint8_t>(in[1 + i] + p);
    }
    for (uint32_t x = 0; x < w; ++x) {
      const uint8_t* p = cur.data() + static_cast<size_t>(x) * bpp;
      const Rgb px = channels >= 3 ? Rgb{p[0], p[1], p[2]} : Rgb{p[0], p[0], p[0]};
      out.set_pixel(static_cast<int>(x), static_cast<int>(y), px);
    }
    std::swap(cur, prev);
  }
  return out;
}

Canvas read_png(const std::string& path) { return decode_png(read_file(path), path); }

}  // namespace easyctx::eval
