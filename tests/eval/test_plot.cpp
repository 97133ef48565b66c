// The line chart of easyctx_eval_ppl, read back from its PNG: each model's colour sits at its
// points (markers where the chart's frame maps them), its line in the columns between them,
// nothing where a value is NaN; tick labels are compact.
#include <cmath>
#include <limits>

#include "eval/perplexity.h"
#include "eval/plot.h"
#include "eval/png.h"
#include "train/train_test_util.h"

namespace easyctx::test {
namespace {

int count_colour(const eval::Canvas& c, eval::Rgb col, int x0, int x1, int y0, int y1) {
  int n = 0;
  for (int y = std::max(0, y0); y <= std::min(c.height() - 1, y1); ++y)
    for (int x = std::max(0, x0); x <= std::min(c.width() - 1, x1); ++x) n += c.pixel(x, y) == col;
  return n;
}

TEST(Plot, PerplexityChartEncodesTheValues) {
  std::vector<eval::PplResult> res(2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<int64_t> L = {4096, 8192, 16384, 32768, 65536};
  const std::vector<double> a = {12.0, 10.5, 9.8, 9.5, 9.4}, b = {20.0, 22.0, nan, 30.0, 60.0};
  for (size_t m = 0; m < 2; ++m) {
    res[m].label = m ? "stage-2" : "stage-1";
    for (size_t i = 0; i < L.size(); ++i) {
      eval::PplRow r;
      r.tokens = L[i];
      r.ppl = m ? b[i] : a[i];
      res[m].rows.push_back(r);
    }
  }
  const eval::LineChart chart = eval::ppl_chart(res);
  EXPECT_TRUE(chart.log_x);  // 4K..64K spans 16x
  TempDir dir("plot");
  eval::write_png(dir / "ppl.png", eval::render_line_chart(chart));
  const eval::Canvas c = eval::read_png(dir / "ppl.png");
  ASSERT_EQ(c.width(), chart.width);
  const eval::ChartFrame f = eval::chart_frame(chart);
  for (size_t m = 0; m < 2; ++m) {
    const eval::Rgb col = eval::palette(m);
    const std::vector<double>& y = m ? b : a;
    for (size_t i = 0; i < L.size(); ++i) {
      const int px = f.px(static_cast<double>(L[i]));
      if (std::isnan(y[i])) {
        // No marker of this series in the column band where the NaN would be.
        EXPECT_EQ(count_colour(c, col, px - 1, px + 1, f.top + 1, f.bottom - 1), 0) << "point " << i;
        continue;
      }
      const int py = f.py(y[i]);
      EXPECT_GE(count_colour(c, col, px - 3, px + 3, py - 3, py + 3), 40) << "series " << m << " point " << i;
      // Higher perplexity is drawn higher: the value maps inside the plot area.
      EXPECT_GE(py, f.top);
      EXPECT_LE(py, f.bottom);
    }
    // The line between the first two points crosses the column halfway.
    const int mid = (f.px(static_cast<double>(L[0])) + f.px(static_cast<double>(L[1]))) / 2;
    EXPECT_GT(count_colour(c, col, mid, mid, f.top, f.bottom), 0) << "series " << m;
  }
  // Series b: 30 above 20 on screen (smaller y), its last point is the highest.
  EXPECT_LT(f.py(60.0), f.py(30.0));
  EXPECT_LT(f.py(30.0), f.py(20.0));
  // The x ticks at the lengths read as 4K ... 64K.
  EXPECT_EQ(eval::tick_label(4096), "4K");
  EXPECT_EQ(eval::tick_label(65536), "64K");
  EXPECT_EQ(eval::tick_label(1048576), "1M");
  EXPECT_EQ(eval::tick_label(1572864), "1.5M");
  EXPECT_EQ(eval::tick_label(12.5), "12.5");
  EXPECT_EQ(eval::tick_label(20), "20");
}

}  // namespace
}  // namespace easyctx::test
