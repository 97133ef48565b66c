#include "eval/heatmap.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "report/svg.h"

namespace easyctx::eval {
namespace {

constexpr int kScale = 2;  // text scale: 10x14-pixel glyphs
constexpr int kCharH = kGlyphHeight * kScale;
constexpr Rgb kInk{0x22, 0x22, 0x22}, kAxis{0x55, 0x55, 0x55};

// The width text() covers, without the last glyph's blank column.
int text_width(const std::string& s) {
  const int w = Canvas::text_width(s, kScale);
  return w > 0 ? w - (kCellWidth - kGlyphWidth) * kScale : 0;
}

int max_text_width(const std::vector<std::string>& v) {
  int m = 0;
  for (const std::string& s : v) m = std::max(m, text_width(s));
  return m;
}

}  // namespace

Rgb heat_rgb(double v) { return rgb(report::heat_colour(v)); }

HeatmapGeometry heatmap_geometry(const HeatmapImage& h) {
  HeatmapGeometry g;
  g.rows = static_cast<int>(h.y_ticks.size());
  g.cols = static_cast<int>(h.x_ticks.size());
  g.cell_w = std::clamp(1000 / std::max(g.cols, 1), 4, 64);
  g.cell_h = std::clamp(440 / std::max(g.rows, 1), 6, 40);
  g.left = 16 + kCharH + 10 + max_text_width(h.y_ticks) + 8;
  g.top = 16 + kCharH + 14;
  const int plot_w = g.cols * g.cell_w, plot_h = g.rows * g.cell_h;
  const int bar = 20 + 20 + 8 + text_width("1.0") + 16;
  g.width = std::max(g.left + plot_w + bar, 16 + text_width(h.title) + 16);
  g.width = std::max(g.width, g.left + text_width(h.x_label) + 16);
  g.height = g.top + plot_h + 8 + max_text_width(h.x_ticks) + 12 + kCharH + 12;
  g.height = std::max(g.height, g.top + text_width(h.y_label) + 16);
  return g;
}

Canvas draw_heatmap(const HeatmapImage& h) {
  const HeatmapGeometry g = heatmap_geometry(h);
  EASYCTX_CHECK(g.rows > 0 && g.cols > 0, "draw_heatmap: no rows or columns");
  EASYCTX_CHECK(h.value.size() == static_cast<size_t>(g.rows), "draw_heatmap: ", h.value.size(), " rows of values for ",
                g.rows, " row ticks");
  for (const auto& row : h.value)
    EASYCTX_CHECK(row.size() == static_cast<size_t>(g.cols), "draw_heatmap: a row of ", row.size(), " values for ",
                  g.cols, " column ticks");
  Canvas c(g.width, g.height);
  const int plot_w = g.cols * g.cell_w, plot_h = g.rows * g.cell_h;
  c.text(16, 16, h.title, kInk, kScale);
  for (int r = 0; r < g.rows; ++r)
    for (int k = 0; k < g.cols; ++k)
      c.fill_rect(g.left + k * g.cell_w, g.top + r * g.cell_h, g.cell_w, g.cell_h,
                  heat_rgb(h.value[static_cast<size_t>(r)][static_cast<size_t>(k)]));
  // Row ticks, right-aligned, each centred on its row; thinned so they never overlap.
  const int row_step = std::max(1, (kCharH + 4 + g.cell_h - 1) / g.cell_h);
  for (int r = 0; r < g.rows; r += row_step) {
    const std::string& s = h.y_ticks[static_cast<size_t>(r)];
    c.text(g.left - 8 - text_width(s), g.top + r * g.cell_h + (g.cell_h - kCharH) / 2, s, kInk, kScale);
  }
  // Column ticks, written upwards under their columns; thinned likewise.
  const int col_step = std::max(1, (kCharH + 4 + g.cell_w - 1) / g.cell_w);
  const int tick_w = max_text_width(h.x_ticks);
  for (int k = 0; k < g.cols; k += col_step) {
    const std::string& s = h.x_ticks[static_cast<size_t>(k)];
    const int x = g.left + k * g.cell_w + (g.cell_w - kCharH) / 2;
    c.line(g.left + k * g.cell_w + g.cell_w / 2, g.top + plot_h, g.left + k * g.cell_w + g.cell_w / 2,
           g.top + plot_h + 4, kAxis);
    c.text_up(x, g.top + plot_h + 8 + text_width(s), s, kInk, kScale);
  }
  c.text(g.left + std::max(0, (plot_w - text_width(h.x_label)) / 2), g.top + plot_h + 8 + tick_w + 12, h.x_label, kInk,
         kScale);
  c.text_up(16, g.top + (plot_h + text_width(h.y_label)) / 2, h.y_label, kInk, kScale);
  // Colour bar: 1 at the top, 0 at the bottom.
  const int bx = g.left + plot_w + 20;
  for (int y = 0; y < plot_h; ++y)
    c.fill_rect(bx, g.top + y, 20, 1, heat_rgb(1.0 - static_cast<double>(y) / std::max(plot_h - 1, 1)));
  const char* labels[3] = {"1.0", "0.5", "0.0"};
  for (int i = 0; i < 3; ++i) {
    const int y = g.top + (plot_h - 1) * i / 2;
    c.line(bx + 20, y, bx + 24, y, kAxis);
    c.text(bx + 28, std::clamp(y - kCharH / 2, g.top, g.top + plot_h - kCharH), labels[i], kInk, kScale);
  }
  return c;
}

}  // namespace easyctx::eval
