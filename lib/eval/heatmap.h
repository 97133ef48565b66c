// Heatmaps as PNG images in EasyContext's colours (red #F0496E at 0, yellow #EBB839 at 0.5,
// green #0CD79F at 1: report::heat_colour, the scale of the run report's SVG heatmaps), laid
// out as EasyContext's needle figure: one cell per (row, column), rows top to bottom, the
// column ticks written upwards under the cells, a colour bar on the right.
#pragma once
#include <string>
#include <vector>

#include "eval/png.h"

namespace easyctx::eval {

struct HeatmapImage {
  std::string title, x_label, y_label;
  std::vector<std::string> x_ticks, y_ticks;  // columns, rows (row 0 at the top)
  std::vector<std::vector<double>> value;     // [row][column] in [0, 1]; NaN: no data (grey)
};

// Where the cells are: cell (r, c) covers x in [left + c * cell_w, left + (c + 1) * cell_w),
// y in [top + r * cell_h, top + (r + 1) * cell_h).
struct HeatmapGeometry {
  int left = 0, top = 0, cell_w = 0, cell_h = 0, rows = 0, cols = 0, width = 0, height = 0;
};

// report::heat_colour(v) as a pixel colour (NaN: the grey of missing cells).
Rgb heat_rgb(double v);

HeatmapGeometry heatmap_geometry(const HeatmapImage& h);
// Throws Error when value's shape differs from the ticks'.
Canvas draw_heatmap(const HeatmapImage& h);

}  // namespace easyctx::eval
