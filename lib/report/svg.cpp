#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace easyctx::report {
namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A short tick label: 1.2K, 3.4M, 0.0123, 12.5.
std::string tick(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt("%.3gG", v / 1e9);
  if (a >= 1e6) return fmt("%.3gM", v / 1e6);
  if (a >= 1e4) return fmt("%.3gK", v / 1e3);
  return fmt("%.4g", v);
}

// About `n` round tick values spanning [lo, hi]; `integer`: whole numbers only (steps).
std::vector<double> nice_ticks(double lo, double hi, int n, bool integer = false) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (integer && m == 2.5 && mag < 10) continue;  // 2.5, 0.25: not whole
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  if (integer) step = std::max(step, 1.0);
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

}  // namespace

std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0) || !(hi > lo)) return {lo};
  const double a = std::log10(lo), b = std::log10(hi), eps = 1e-9;
  const int k0 = static_cast<int>(std::floor(a)), k1 = static_cast<int>(std::ceil(b));
  std::vector<double> one25, decades;
  for (int k = k0; k <= k1; ++k)
    for (double m : {1.0, 2.0, 5.0}) {
      const double l = std::log10(m) + k;
      if (l < a - eps || l > b + eps) continue;
      const double v = k >= 0 ? m * std::pow(10.0, k) : m / std::pow(10.0, -k);  // (0.05 as written)
      one25.push_back(v);
      if (m == 1.0) decades.push_back(v);
    }
  if (one25.size() >= 2 && one25.size() <= 8) return one25;
  if (one25.size() > 8) {  // (then at least three decades)
    const size_t every = (decades.size() + 7) / 8;
    std::vector<double> t;
    for (double v : decades)
      if (static_cast<int>(std::lround(std::log10(v))) % static_cast<int>(every) == 0) t.push_back(v);
    return t.size() >= 2 ? t : decades;
  }
  std::vector<double> t;
  for (double v : nice_ticks(lo, hi, 4))
    if (v > 0) t.push_back(v);
  return t;
}

std::string log_tick_label(double v) {
  if (v >= 1e4) return tick(v);
  if (v >= 1e-3) return fmt("%.4g", v);
  std::string s = fmt("%.3g", v);  // 2e-05 -> 2e-5
  const size_t e = s.find("e-0");
  if (e != std::string::npos) s.erase(e + 2, 1);
  return s;
}

double marker_label_width(const std::string& label) { return 6.0 * static_cast<double>(label.size()); }

std::vector<LabelPlace> place_marker_labels(const std::vector<double>& px, const std::vector<std::string>& labels,
                                            double left, double right, int rows) {
  const double pad = 3, gap = 4;
  std::vector<LabelPlace> out(px.size());
  std::vector<size_t> order(px.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) { return px[i] < px[j]; });
  std::vector<double> row_end(static_cast<size_t>(std::max(rows, 0)), -std::numeric_limits<double>::infinity());
  for (size_t i : order) {
    LabelPlace& p = out[i];
    const double w = i < labels.size() ? marker_label_width(labels[i]) : 0;
    p.end_anchor = px[i] + pad + w > right && px[i] - pad - w >= left;
    p.x0 = p.end_anchor ? px[i] - pad - w : px[i] + pad;
    p.x1 = p.x0 + w;
    for (size_t r = 0; r < row_end.size(); ++r)
      if (p.x0 >= row_end[r] + gap) {
        p.shown = true;
        p.row = static_cast<int>(r);
        row_end[r] = p.x1;
        break;
      }
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

namespace {

// A line chart's plot area and data range; maps data to pixels. y0 and y1 are in axis units (log10 of the
// data on a log axis).
struct Frame {
  double left = 70, right = 150, top = 28, bottom = 42;
  double w = 0, h = 0;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  bool log_y = false;
  double yv(double y) const { return log_y ? std::log10(y) : y; }
  double px(double x) const { return left + (x - x0) / (x1 - x0) * w; }
  double py(double y) const { return top + h - (yv(y) - y0) / (y1 - y0) * h; }
  bool empty() const { return !std::isfinite(x0); }
};

// The frame of `c` around the extent of its plottable points (finite, and positive on a log axis).
Frame data_frame(const LineChart& c) {
  Frame f;
  f.w = c.width - f.left - f.right, f.h = c.height - f.top - f.bottom;
  f.log_y = c.log_y;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i]) || (c.log_y && s.y[i] <= 0)) continue;
      f.x0 = std::min(f.x0, s.x[i]), f.x1 = std::max(f.x1, s.x[i]);
      f.y0 = std::min(f.y0, f.yv(s.y[i])), f.y1 = std::max(f.y1, f.yv(s.y[i]));
    }
  return f;
}

// Widens a non-empty range so that no point sits on the frame and a single value still has a scale.
void pad_range(Frame& f) {
  if (f.x1 == f.x0) f.x1 = f.x0 + 1;
  if (f.y1 == f.y0) {  // a constant: a band around it of its own scale
    const double band = f.y0 != 0 ? 0.1 * std::fabs(f.y0) : 1.0;
    f.y0 -= band, f.y1 += band;
  }
  const double pad = 0.05 * (f.y1 - f.y0);
  f.y0 -= pad, f.y1 += pad;
}

// The frame, the ticks and grid lines of both axes, and the axis labels.
std::string axes_svg(const LineChart& c, const Frame& f) {
  const double left = f.left, top = f.top, w = f.w, h = f.h, y0 = f.y0, y1 = f.y1;
  std::string o = "<rect x=\"" + fmt("%.1f", left) + "\" y=\"" + fmt("%.1f", top) + "\" width=\"" + fmt("%.1f", w) +
                  "\" height=\"" + fmt("%.1f", h) + "\" class=\"frame\"/>";
  for (double t : nice_ticks(f.x0, f.x1, 6, c.integer_x))
    o += "<text x=\"" + fmt("%.1f", f.px(t)) + "\" y=\"" + fmt("%.1f", top + h + 16) +
         "\" text-anchor=\"middle\" class=\"tick\">" + tick(t) + "</text>";
  // y ticks: (position on the axis, label); a log axis at its data values' logarithms.
  std::vector<std::pair<double, std::string>> yt;
  if (c.log_y)
    for (double v : log_ticks(std::pow(10.0, y0), std::pow(10.0, y1)))
      yt.emplace_back(std::log10(v), log_tick_label(v));
  else
    for (double t : nice_ticks(y0, y1, 5)) yt.emplace_back(t, tick(t));
  for (const auto& [t, label] : yt) {
    const double y = top + h - (t - y0) / (y1 - y0) * h;
    o += "<line x1=\"" + fmt("%.1f", left) + "\" x2=\"" + fmt("%.1f", left + w) + "\" y1=\"" + fmt("%.1f", y) +
         "\" y2=\"" + fmt("%.1f", y) + "\" class=\"grid\"/>";
    o += "<text x=\"" + fmt("%.1f", left - 6) + "\" y=\"" + fmt("%.1f", y + 4) +
         "\" text-anchor=\"end\" class=\"tick\">" + label + "</text>";
  }
  o += "<text x=\"" + fmt("%.1f", left + w / 2) + "\" y=\"" + fmt("%.1f", top + h + 34) +
       "\" text-anchor=\"middle\" class=\"axis\">" + html_escape(c.x_label) + "</text>";
  o += "<text transform=\"translate(14," + fmt("%.1f", top + h / 2) +
       ") rotate(-90)\" text-anchor=\"middle\" "
       "class=\"axis\">" +
       html_escape(c.y_label) + "</text>";
  return o;
}

// The dashed marker lines inside the x range, labelled where there is room (else a tooltip names them).
std::string markers_svg(const LineChart& c, const Frame& f) {
  const double top = f.top, h = f.h;
  std::vector<const Marker*> shown;
  std::vector<double> mx;
  std::vector<std::string> ml;
  for (const Marker& m : c.markers)
    if (m.x >= f.x0 && m.x <= f.x1) shown.push_back(&m), mx.push_back(f.px(m.x)), ml.push_back(m.label);
  const std::vector<LabelPlace> place = place_marker_labels(mx, ml, f.left, f.left + f.w);
  std::string o;
  for (size_t i = 0; i < shown.size(); ++i) {
    const Marker& m = *shown[i];
    const LabelPlace& p = place[i];
    o += "<line x1=\"" + fmt("%.1f", mx[i]) + "\" x2=\"" + fmt("%.1f", mx[i]) + "\" y1=\"" + fmt("%.1f", top) +
         "\" y2=\"" + fmt("%.1f", top + h) + "\" stroke=\"" + m.colour + "\" stroke-dasharray=\"4 3\">" +
         (p.shown ? "" : "<title>" + html_escape(m.label) + "</title>") + "</line>";
    if (p.shown)
      o += "<text x=\"" + fmt("%.1f", p.end_anchor ? p.x1 : p.x0) + "\" y=\"" + fmt("%.1f", top + 11 + 11.0 * p.row) +
           "\"" + (p.end_anchor ? " text-anchor=\"end\"" : "") + " class=\"marker\" fill=\"" + m.colour + "\">" +
           html_escape(m.label) + "</text>";
  }
  return o;
}

// Series k: its line (broken at points it cannot plot), its dots when it has few points, its legend entry.
std::string series_svg(const LineChart& c, const Frame& f, size_t k) {
  const double left = f.left, top = f.top, w = f.w;
  const Series& s = c.series[k];
  const std::string colour = s.colour.empty() ? kPalette[k % 8] : s.colour;
  std::string path;
  bool pen = false;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
    if (!std::isfinite(s.y[i]) || (c.log_y && s.y[i] <= 0)) {
      pen = false;
      continue;
    }
    path += (pen ? " L" : " M") + fmt("%.1f", f.px(s.x[i])) + " " + fmt("%.1f", f.py(s.y[i]));
    pen = true;
  }
  std::string o = "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"1.6\"/>";
  if (s.x.size() <= 40)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i]) && (!c.log_y || s.y[i] > 0))
        o += "<circle cx=\"" + fmt("%.1f", f.px(s.x[i])) + "\" cy=\"" + fmt("%.1f", f.py(s.y[i])) +
             "\" r=\"2.5\" fill=\"" + colour + "\"/>";
  const double ly = top + 14 + 16.0 * static_cast<double>(k);
  o += "<line x1=\"" + fmt("%.1f", left + w + 10) + "\" x2=\"" + fmt("%.1f", left + w + 26) + "\" y1=\"" +
       fmt("%.1f", ly - 4) + "\" y2=\"" + fmt("%.1f", ly - 4) + "\" stroke=\"" + colour + "\" stroke-width=\"2\"/>";
  o += "<text x=\"" + fmt("%.1f", left + w + 30) + "\" y=\"" + fmt("%.1f", ly) + "\" class=\"legend\">" +
       html_escape(s.name) + "</text>";
  return o;
}

}  // namespace

std::string svg_line_chart(const LineChart& c) {
  Frame f = data_frame(c);
  std::string o = "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(c.width) +
                  "\" height=\"" + std::to_string(c.height) + "\" role=\"img\" aria-label=\"" + html_escape(c.title) +
                  "\">";
  o += "<text x=\"" + fmt("%.0f", f.left) + "\" y=\"18\" class=\"title\">" + html_escape(c.title) + "</text>";
  if (f.empty()) {
    o += "<text x=\"" + fmt("%.0f", f.left) + "\" y=\"" + fmt("%.0f", f.top + f.h / 2) + "\">no data</text></svg>";
    return o;
  }
  pad_range(f);
  o += axes_svg(c, f);
  o += markers_svg(c, f);
  for (size_t k = 0; k < c.series.size(); ++k) o += series_svg(c, f, k);
  return o + "</svg>";
}

std::string heat_colour(double v) {
  if (!std::isfinite(v)) return "#dddddd";
  v = std::min(1.0, std::max(0.0, v));
  const int red[3] = {0xF0, 0x49, 0x6E}, yellow[3] = {0xEB, 0xB8, 0x39}, green[3] = {0x0C, 0xD7, 0x9F};
  const int* a = v < 0.5 ? red : yellow;
  const int* b = v < 0.5 ? yellow : green;
  const double t = v < 0.5 ? v / 0.5 : (v - 0.5) / 0.5;
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02X%02X%02X", static_cast<int>(std::lround(a[0] + t * (b[0] - a[0]))),
                static_cast<int>(std::lround(a[1] + t * (b[1] - a[1]))),
                static_cast<int>(std::lround(a[2] + t * (b[2] - a[2]))));
  return buf;
}

std::string svg_heatmap(const Heatmap& hm) {
  const int rows = static_cast<int>(hm.y_ticks.size()), cols = static_cast<int>(hm.x_ticks.size());
  const int left = 70, top = 30, c = hm.cell;
  // (the title: 13px bold, about 8px a character)
  const int width = std::max(left + cols * c + 20, 8 * static_cast<int>(hm.title.size()) + left),
            height = top + rows * c + 60;
  std::string o = "<svg class=\"heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
                  "\" height=\"" + std::to_string(height) + "\" role=\"img\" aria-label=\"" + html_escape(hm.title) +
                  "\">";
  o += "<text x=\"" + std::to_string(left) + "\" y=\"18\" class=\"title\">" + html_escape(hm.title) + "</text>";
  for (int r = 0; r < rows; ++r) {
    o += "<text x=\"" + std::to_string(left - 6) + "\" y=\"" + std::to_string(top + r * c + c / 2 + 4) +
         "\" text-anchor=\"end\" class=\"tick\">" + html_escape(hm.y_ticks[static_cast<size_t>(r)]) + "</text>";
    for (int k = 0; k < cols; ++k) {
      const double v = static_cast<size_t>(r) < hm.value.size() && static_cast<size_t>(k) < hm.value[r].size()
                           ? hm.value[static_cast<size_t>(r)][static_cast<size_t>(k)]
                           : std::numeric_limits<double>::quiet_NaN();
      o += "<rect x=\"" + std::to_string(left + k * c) + "\" y=\"" + std::to_string(top + r * c) + "\" width=\"" +
           std::to_string(c) + "\" height=\"" + std::to_string(c) + "\" fill=\"" + heat_colour(v) + "\" data-row=\"" +
           std::to_string(r) + "\" data-col=\"" + std::to_string(k) + "\" data-score=\"" +
           (std::isfinite(v) ? fmt("%.4f", v) : std::string("nan")) + "\"><title>" +
           html_escape(hm.y_label + " " + hm.y_ticks[static_cast<size_t>(r)] + ", " + hm.x_label + " " +
                       hm.x_ticks[static_cast<size_t>(k)]) +
           ": " + (std::isfinite(v) ? fmt("%.3f", v) : std::string("no data")) + "</title></rect>";
    }
  }
  for (int k = 0; k < cols; ++k)
    o += "<text transform=\"translate(" + std::to_string(left + k * c + c / 2 + 4) + "," +
         std::to_string(top + rows * c + 8) + ") rotate(60)\" class=\"tick\">" +
         html_escape(hm.x_ticks[static_cast<size_t>(k)]) + "</text>";
  o += "<text x=\"" + std::to_string(left + cols * c / 2) + "\" y=\"" + std::to_string(height - 4) +
       "\" text-anchor=\"middle\" class=\"axis\">" + html_escape(hm.x_label) + "</text>";
  return o + "</svg>";
}

}  // namespace easyctx::report
