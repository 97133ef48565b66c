// Charts as inline SVG for the run report (easyctx_report): line charts with several series
// and marked x positions (stage boundaries, restarts), and heatmaps (needle-in-a-haystack:
// depth x context length) in EasyContext's colours. Plain strings, no scripts, so the page
// renders anywhere without a network.
#pragma once
#include <string>
#include <vector>

namespace easyctx::report {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; NaN y values are gaps
  std::string colour;        // "" picks one from the palette
};

struct Marker {
  double x;
  std::string label;
  std::string colour = "#888888";
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  std::vector<Marker> markers;  // vertical lines
  bool log_y = false;
  int width = 760, height = 300;
};

std::string svg_line_chart(const LineChart& c);

struct Heatmap {
  std::string title, x_label, y_label;
  std::vector<std::string> x_ticks, y_ticks;  // columns (context lengths), rows (depths)
  std::vector<std::vector<double>> value;     // [row][column] in [0, 1]; NaN: no data
  int cell = 34;
};

// EasyContext's scale: red #F0496E (0) - yellow #EBB839 (0.5) - green #0CD79F (1).
std::string heat_colour(double v);
std::string svg_heatmap(const Heatmap& h);

// Text for HTML: & < > " escaped.
std::string html_escape(const std::string& s);

}  // namespace easyctx::report
