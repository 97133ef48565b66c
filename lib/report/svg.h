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
  bool integer_x = false;  // x ticks at whole numbers only (steps)
  int width = 760, height = 300;
};

// A line chart: x ticks at round values; y ticks at round values, or on a log axis (log_y) at
// log_ticks' values labelled by log_tick_label. Marker labels sit at the top of the plot in up
// to kMarkerRows rows (place_marker_labels); one that fits no row is left out, its line kept
// with the label as its tooltip.
std::string svg_line_chart(const LineChart& c);

// The values a log axis spanning [lo, hi] (0 < lo < hi) is ticked at, ascending: 1-2-5 x 10^k
// when that gives 2 to 8 ticks; powers of ten when it gives more (every n-th decade when
// there are more than 8); round linear steps when the range holds fewer than two 1-2-5 values
// (less than about half a decade).
std::vector<double> log_ticks(double lo, double hi);
// A log axis tick's label: 0.001 to 9999 as written (0.002, 0.5, 20, 5000), 10K, 2M and 5G
// above, 2e-5 below.
std::string log_tick_label(double v);

// Where a marker's label goes: hidden (no row had room), or in `row` (0: the top one) over
// [x0, x1], written after its line (x0 = line + 3) or, where that would cross the plot's right
// edge, before it (end_anchor: x1 = line - 3).
struct LabelPlace {
  bool shown = false;
  int row = 0;
  bool end_anchor = false;
  double x0 = 0, x1 = 0;
};
constexpr int kMarkerRows = 3;
// The width a marker label takes (its font, 10px, at a generous 6px a character).
double marker_label_width(const std::string& label);
// Places the labels of lines at pixel positions px (any order) inside [left, right]: in x
// order, each in the first row where it keeps 4px from the label before it, or hidden.
std::vector<LabelPlace> place_marker_labels(const std::vector<double>& px, const std::vector<std::string>& labels,
                                            double left, double right, int rows = kMarkerRows);

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
