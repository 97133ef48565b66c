// Line charts on the evaluation canvas (png.h): several series of (x, y) points on shared
// axes with round tick values, a title, axis titles and a legend; NaN points are left out
// (the line breaks there). easyctx_eval_ppl draws perplexity against context length with it.
#pragma once
#include <string>
#include <vector>

#include "eval/png.h"

namespace easyctx::eval {

struct Series {
  std::string label;
  std::vector<double> x, y;
  Rgb colour{0, 0, 0};
  bool auto_colour = true;  // palette(index) unless false
};

struct LineChart {
  std::string title, x_title, y_title;
  std::vector<Series> series;
  bool log_x = false;  // log2 axis (context lengths); x must be > 0
  int width = 960, height = 600;
};

// Where the plot area lies and how data map into it (render_line_chart's own geometry).
struct ChartFrame {
  int left = 0, top = 0, right = 0, bottom = 0;  // the plot area: [left, right] x [top, bottom]
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;         // the data range shown (log2 of x with log_x)
  bool log_x = false;
  int px(double x) const;  // pixel column of data x
  int py(double y) const;  // pixel row of data y
};
ChartFrame chart_frame(const LineChart& c);

Canvas render_line_chart(const LineChart& c);

// Tick labels: "512", "32K", "1M", "1.5M"; "12.5", "0.031".
std::string tick_label(double v);

}  // namespace easyctx::eval
