#include "eval/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace easyctx::eval {
namespace {

constexpr int kText = 2;  // glyph scale of every label

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// About `n` round values spanning [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int n) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(hi >= lo); }
};

// The legend's box beside the plot area (0 without series).
int legend_width(const LineChart& c) {
  if (c.series.empty()) return 0;
  int w = 0;
  for (const Series& s : c.series) w = std::max(w, Canvas::text_width(s.label, kText));
  return 36 + w + 16 + 12;
}

}  // namespace

std::string tick_label(double v) {
  const double a = std::abs(v);
  auto trim = [](std::string s) {
    if (s.find('.') != std::string::npos) {
      while (!s.empty() && s.back() == '0') s.pop_back();
      if (!s.empty() && s.back() == '.') s.pop_back();
    }
    return s;
  };
  if (a >= 1 << 20 && std::fmod(a, 1 << 10) == 0) return trim(fmt("%.2f", v / (1 << 20))) + "M";
  if (a >= 1 << 10 && std::fmod(a, 1 << 10) == 0) return trim(fmt("%.1f", v / (1 << 10))) + "K";
  if (a >= 1e6) return trim(fmt("%.2f", v / 1e6)) + "M";
  if (a >= 1e4) return trim(fmt("%.1f", v / 1e3)) + "K";
  if (a >= 100 || a == std::floor(a)) return fmt("%.0f", v);
  if (a >= 1) return trim(fmt("%.2f", v));
  return trim(fmt("%.3g", v));
}

int ChartFrame::px(double x) const {
  const double v = log_x ? std::log2(x) : x;
  return left + static_cast<int>(std::lround((v - x0) / (x1 - x0) * (right - left)));
}

int ChartFrame::py(double y) const {
  return bottom - static_cast<int>(std::lround((y - y0) / (y1 - y0) * (bottom - top)));
}

ChartFrame chart_frame(const LineChart& c) {
  ChartFrame f;
  f.log_x = c.log_x;
  f.left = 14 + kCellHeight * kText + 6 * kCellWidth * kText;  // y title, then tick labels
  f.right = c.width - 24 - legend_width(c);
  f.top = 20 + kCellHeight * kText + 16;
  f.bottom = c.height - (16 + 2 * kCellHeight * kText + 12);
  Range xr, yr;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i]) || (c.log_x && s.x[i] <= 0)) continue;
      xr.add(c.log_x ? std::log2(s.x[i]) : s.x[i]);
      yr.add(s.y[i]);
    }
  if (xr.empty()) xr = {0, 1};
  if (yr.empty()) yr = {0, 1};
  if (xr.hi == xr.lo) xr = {xr.lo - 1, xr.hi + 1};
  if (yr.hi == yr.lo) yr = {yr.lo - 1, yr.hi + 1};
  const double px = (xr.hi - xr.lo) * 0.04, py = (yr.hi - yr.lo) * 0.08;
  f.x0 = xr.lo - px;
  f.x1 = xr.hi + px;
  f.y0 = yr.lo - py;
  f.y1 = yr.hi + py;
  return f;
}

Canvas render_line_chart(const LineChart& c) {
  Canvas cv(c.width, c.height);
  const ChartFrame f = chart_frame(c);
  const int ch = kCellHeight * kText;
  // Grid and ticks.
  std::vector<double> xt;
  if (c.log_x) {
    const int e0 = static_cast<int>(std::ceil(f.x0)), e1 = static_cast<int>(std::floor(f.x1));
    const int every = std::max(1, (e1 - e0 + 1 + 9) / 10);
    for (int e = e0; e <= e1; e += every) xt.push_back(std::ldexp(1.0, e));
  } else {
    xt = nice_ticks(f.x0, f.x1, 8);
  }
  for (double x : xt) {
    const int p = f.px(x);
    if (p < f.left || p > f.right) continue;
    cv.line(p, f.top, p, f.bottom, kLightGrey);
    cv.line(p, f.bottom, p, f.bottom + 5, kBlack);
    const std::string s = tick_label(x);
    cv.text(p - Canvas::text_width(s, kText) / 2, f.bottom + 9, s, kBlack, kText);
  }
  for (double y : nice_ticks(f.y0, f.y1, 6)) {
    const int p = f.py(y);
    if (p < f.top || p > f.bottom) continue;
    cv.line(f.left, p, f.right, p, kLightGrey);
    cv.line(f.left - 5, p, f.left, p, kBlack);
    const std::string s = tick_label(y);
    cv.text(f.left - 9 - Canvas::text_width(s, kText), p - ch / 2 + 1, s, kBlack, kText);
  }
  cv.rect(f.left, f.top, f.right - f.left + 1, f.bottom - f.top + 1, kBlack);
  // Titles.
  cv.text((c.width - Canvas::text_width(c.title, kText)) / 2, 14, c.title, kBlack, kText);
  cv.text((f.left + f.right - Canvas::text_width(c.x_title, kText)) / 2, c.height - 12 - ch, c.x_title, kBlack, kText);
  cv.text_up(10, (f.top + f.bottom + Canvas::text_width(c.y_title, kText)) / 2, c.y_title, kBlack, kText);
  // Series: lines between consecutive finite points, a square marker on each.
  for (size_t si = 0; si < c.series.size(); ++si) {
    const Series& s = c.series[si];
    const Rgb col = s.auto_colour ? palette(si) : s.colour;
    bool have_prev = false;
    int qx = 0, qy = 0;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i]) || (c.log_x && s.x[i] <= 0)) {
        have_prev = false;
        continue;
      }
      const int x = f.px(s.x[i]), y = f.py(s.y[i]);
      if (have_prev) cv.line(qx, qy, x, y, col, 2);
      have_prev = true;
      qx = x;
      qy = y;
    }
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i]) && std::isfinite(s.x[i]) && !(c.log_x && s.x[i] <= 0))
        cv.fill_rect(f.px(s.x[i]) - 3, f.py(s.y[i]) - 3, 7, 7, col);
  }
  // Legend, right of the plot area.
  if (!c.series.empty()) {
    const int row = ch + 6, bw = legend_width(c) - 12, bh = static_cast<int>(c.series.size()) * row + 10;
    const int x0 = f.right + 12, y0 = f.top;
    cv.fill_rect(x0, y0, bw, bh, kWhite);
    cv.rect(x0, y0, bw, bh, kGrey);
    for (size_t si = 0; si < c.series.size(); ++si) {
      const Series& s = c.series[si];
      const Rgb col = s.auto_colour ? palette(si) : s.colour;
      const int y = y0 + 6 + static_cast<int>(si) * row;
      cv.fill_rect(x0 + 8, y + ch / 2 - 2, 22, 4, col);
      cv.text(x0 + 38, y + 1, s.label, kBlack, kText);
    }
  }
  return cv;
}

}  // namespace easyctx::eval
