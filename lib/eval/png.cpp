#include "eval/png.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace easyctx::eval {
namespace {

// 5x7 glyphs of ASCII 32..126, one byte per row (bit 4 = leftmost column), drawn for this
// file.
const uint8_t kGlyphs[95][7] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // ' '
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04},  // '!'
    {0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00},  // '"'
    {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A},  // '#'
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04},  // '$'
    {0x19, 0x19, 0x02, 0x04, 0x08, 0x13, 0x13},  // '%'
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D},  // '&'
    {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00},  // "'"
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02},  // '('
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08},  // ')'
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00},  // '*'
    {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00},  // '+'
    {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08},  // ','
    {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00},  // '-'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C},  // '.'
    {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10},  // '/'
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E},  // '0'
    {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},  // '1'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F},  // '2'
    {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},  // '3'
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02},  // '4'
    {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},  // '5'
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E},  // '6'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},  // '7'
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E},  // '8'
    {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},  // '9'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00},  // ':'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08},  // ';'
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02},  // '<'
    {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00},  // '='
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08},  // '>'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04},  // '?'
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E},  // '@'
    {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},  // 'A'
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E},  // 'B'
    {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E},  // 'C'
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C},  // 'D'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F},  // 'E'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10},  // 'F'
    {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F},  // 'G'
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},  // 'H'
    {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},  // 'I'
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},  // 'J'
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11},  // 'K'
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F},  // 'L'
    {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11},  // 'M'
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11},  // 'N'
    {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},  // 'O'
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10},  // 'P'
    {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D},  // 'Q'
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11},  // 'R'
    {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E},  // 'S'
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // 'T'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},  // 'U'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04},  // 'V'
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A},  // 'W'
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11},  // 'X'
    {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04},  // 'Y'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F},  // 'Z'
    {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E},  // '['
    {0x10, 0x10, 0x08, 0x04, 0x02, 0x01, 0x01},  // '\\'
    {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E},  // ']'
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00},  // '^'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F},  // '_'
    {0x08, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00},  // '`'
    {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F},  // 'a'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E},  // 'b'
    {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E},  // 'c'
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F},  // 'd'
    {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E},  // 'e'
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08},  // 'f'
    {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // 'g'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11},  // 'h'
    {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E},  // 'i'
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C},  // 'j'
    {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12},  // 'k'
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},  // 'l'
    {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11},  // 'm'
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11},  // 'n'
    {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E},  // 'o'
    {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10},  // 'p'
    {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01},  // 'q'
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10},  // 'r'
    {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E},  // 's'
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06},  // 't'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D},  // 'u'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04},  // 'v'
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A},  // 'w'
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11},  // 'x'
    {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // 'y'
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F},  // 'z'
    {0x03, 0x04, 0x04, 0x08, 0x04, 0x04, 0x03},  // '{'
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // '|'
    {0x18, 0x04, 0x04, 0x02, 0x04, 0x04, 0x18},  // '}'
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00},  // '~'
};

const uint8_t* glyph(char ch) {
  const unsigned char u = static_cast<unsigned char>(ch);
  return kGlyphs[(u >= 32 && u <= 126 ? u : '?') - 32];
}

uint32_t crc_of(const std::string& type, const std::string& data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(type.data()), static_cast<uInt>(type.size()));
  if (!data.empty()) crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
  return static_cast<uint32_t>(crc);
}

void put_u32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xFF));
}

uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

void put_chunk(std::string& out, const std::string& type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  out += type;
  out += data;
  put_u32(out, crc_of(type, data));
}

const char kSignature[] = "\x89PNG\r\n\x1a\n";

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

}  // namespace

void Canvas::set(int x, int y, uint32_t c) {
  if (x < 0 || y < 0 || x >= w || y >= h) return;
  uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(w) + static_cast<size_t>(x)) * 3];
  p[0] = static_cast<uint8_t>(c >> 16), p[1] = static_cast<uint8_t>(c >> 8), p[2] = static_cast<uint8_t>(c);
}

uint32_t Canvas::get(int x, int y) const {
  EASYCTX_CHECK(x >= 0 && y >= 0 && x < w && y < h, "Canvas::get(", x, ", ", y, ") outside the ", w, "x", h, " canvas");
  const uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(w) + static_cast<size_t>(x)) * 3];
  return (uint32_t{p[0]} << 16) | (uint32_t{p[1]} << 8) | p[2];
}

void Canvas::fill_rect(int x, int y, int rw, int rh, uint32_t c) {
  const int x0 = std::max(x, 0), y0 = std::max(y, 0), x1 = std::min(x + rw, w), y1 = std::min(y + rh, h);
  for (int yy = y0; yy < y1; ++yy)
    for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
}

void Canvas::line(int x0, int y0, int x1, int y1, uint32_t c) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

void Canvas::text(int x, int y, const std::string& s, uint32_t c, int scale) {
  scale = std::max(scale, 1);
  int cx = x, cy = y;
  for (char ch : s) {
    if (ch == '\n') {
      cx = x, cy += 8 * scale;
      continue;
    }
    const uint8_t* g = glyph(ch);
    for (int row = 0; row < 7; ++row)
      for (int col = 0; col < 5; ++col)
        if (g[row] & (0x10 >> col)) fill_rect(cx + col * scale, cy + row * scale, scale, scale, c);
    cx += 6 * scale;
  }
}

int text_width(const std::string& s, int scale) {
  size_t longest = 0, cur = 0;
  for (char ch : s) {
    cur = ch == '\n' ? 0 : cur + 1;
    longest = std::max(longest, cur);
  }
  return longest ? (static_cast<int>(longest) * 6 - 1) * std::max(scale, 1) : 0;
}

int text_height(const std::string& s, int scale) {
  return (static_cast<int>(std::count(s.begin(), s.end(), '\n')) * 8 + 7) * std::max(scale, 1);
}

void write_png(const std::string& path, const Canvas& c) {
  EASYCTX_CHECK(c.w > 0 && c.h > 0 && c.rgb.size() == static_cast<size_t>(c.w) * static_cast<size_t>(c.h) * 3,
                "write_png ", path, ": the canvas is ", c.w, "x", c.h, " with ", c.rgb.size(),
                " bytes of pixels (expected w * h * 3 > 0)");
  const size_t stride = static_cast<size_t>(c.w) * 3;
  // Each row: filter byte 2 (Up: the byte above is subtracted), which turns the flat areas
  // of a chart into runs of zeros.
  std::string raw;
  raw.reserve((stride + 1) * static_cast<size_t>(c.h));
  for (int y = 0; y < c.h; ++y) {
    raw.push_back(2);
    const uint8_t* row = &c.rgb[static_cast<size_t>(y) * stride];
    for (size_t i = 0; i < stride; ++i)
      raw.push_back(static_cast<char>(static_cast<uint8_t>(row[i] - (y ? row[i - stride] : 0))));
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  EASYCTX_CHECK(compress2(reinterpret_cast<Bytef*>(&z[0]), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
                          static_cast<uLong>(raw.size()), 9) == Z_OK,
                "write_png ", path, ": zlib compress2 failed");
  z.resize(zlen);
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(c.w));
  put_u32(ihdr, static_cast<uint32_t>(c.h));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // depth 8, RGB, deflate, adaptive filters, no interlace
  std::string out(kSignature, 8);
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    EASYCTX_CHECK(f.good(), "write_png: cannot write ", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  EASYCTX_CHECK(!ec, "write_png: cannot rename ", tmp, " to ", path, ": ", ec.message());
}

Canvas read_png(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EASYCTX_CHECK_INPUT(f.good(), "read_png: cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  EASYCTX_CHECK_INPUT(s.size() >= 8 && s.compare(0, 8, std::string(kSignature, 8)) == 0, "read_png ", path,
                      ": not a PNG file (bad signature)");
  uint32_t w = 0, h = 0;
  int depth = 0, colour = -1;
  std::string idat;
  bool ended = false;
  for (size_t at = 8; at < s.size() && !ended;) {
    EASYCTX_CHECK_INPUT(at + 12 <= s.size(), "read_png ", path, ": truncated chunk at byte ", at);
    const uint32_t len = get_u32(s, at);
    EASYCTX_CHECK_INPUT(len <= s.size() - at - 12, "read_png ", path, ": chunk at byte ", at, " runs past the end");
    const std::string type = s.substr(at + 4, 4), data = s.substr(at + 8, len);
    EASYCTX_CHECK_INPUT(get_u32(s, at + 8 + len) == crc_of(type, data), "read_png ", path, ": CRC mismatch in chunk ",
                        type, " at byte ", at);
    if (type == "IHDR") {
      EASYCTX_CHECK_INPUT(len == 13, "read_png ", path, ": IHDR of ", len, " bytes (expected 13)");
      w = get_u32(data, 0), h = get_u32(data, 4);
      depth = static_cast<uint8_t>(data[8]), colour = static_cast<uint8_t>(data[9]);
      EASYCTX_CHECK_INPUT(data[10] == 0 && data[11] == 0, "read_png ", path, ": unknown compression or filter method");
      EASYCTX_CHECK_INPUT(data[12] == 0, "read_png ", path, ": interlaced images are not supported");
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  EASYCTX_CHECK_INPUT(w > 0 && h > 0 && w < (1u << 20) && h < (1u << 20), "read_png ", path, ": missing IHDR or size ",
                      w, "x", h, " out of range");
  EASYCTX_CHECK_INPUT(depth == 8, "read_png ", path, ": bit depth ", depth, " (only 8 is supported)");
  int channels = 0;
  switch (colour) {
    case 0: channels = 1; break;
    case 2: channels = 3; break;
    case 4: channels = 2; break;
    case 6: channels = 4; break;
    default: EASYCTX_THROW_INPUT("read_png ", path, ": colour type ", colour, " (palette images are not supported)");
  }
  EASYCTX_CHECK_INPUT(ended, "read_png ", path, ": no IEND chunk (truncated file)");
  const size_t stride = static_cast<size_t>(w) * static_cast<size_t>(channels);
  std::vector<uint8_t> raw((stride + 1) * h);
  uLongf rlen = static_cast<uLongf>(raw.size());
  const int zrc = uncompress(raw.data(), &rlen, reinterpret_cast<const Bytef*>(idat.data()), static_cast<uLong>(idat.size()));
  EASYCTX_CHECK_INPUT(zrc == Z_OK && rlen == raw.size(), "read_png ", path, ": image data does not inflate to ",
                      raw.size(), " bytes (zlib code ", zrc, ")");
  std::vector<uint8_t> px(stride * h);
  for (size_t y = 0; y < h; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &px[y * stride];
    const uint8_t* up = y ? &px[(y - 1) * stride] : nullptr;
    EASYCTX_CHECK_INPUT(filter <= 4, "read_png ", path, ": row ", y, " has filter type ", int{filter});
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? out[i - static_cast<size_t>(channels)] : 0;
      const int b = up ? up[i] : 0;
      const int c = up && i >= static_cast<size_t>(channels) ? up[i - static_cast<size_t>(channels)] : 0;
      int pred = 0;
      switch (filter) {
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: pred = paeth(a, b, c); break;
        default: break;
      }
      out[i] = static_cast<uint8_t>(in[i] + pred);
    }
  }
  Canvas c{static_cast<int>(w), static_cast<int>(h), std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t p = 0; p < static_cast<size_t>(w) * h; ++p) {
    const uint8_t* q = &px[p * static_cast<size_t>(channels)];
    for (int k = 0; k < 3; ++k) c.rgb[p * 3 + static_cast<size_t>(k)] = channels >= 3 ? q[k] : q[0];
  }
  return c;
}

}  // namespace easyctx::eval
