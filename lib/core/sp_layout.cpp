#include "core/sp_layout.h"

#include "core/error.h"

namespace easyctx {

SpLayout parse_sp_layout(const std::string& name) {
  if (name == "none") return SpLayout::None;
  if (name == "contiguous") return SpLayout::Contiguous;
  if (name == "zigzag") return SpLayout::Zigzag;
  if (name == "usp") return SpLayout::Usp;
  EASYCTX_THROW_INPUT("unknown sequence-parallel layout '", name, "', expected none, contiguous, zigzag or usp");
}

const char* sp_layout_name(SpLayout l) {
  switch (l) {
    case SpLayout::None: return "none";
    case SpLayout::Contiguous: return "contiguous";
    case SpLayout::Zigzag: return "zigzag";
    case SpLayout::Usp: return "usp";
  }
  return "?";
}

int64_t sp_length_multiple(SpLayout layout, int world) {
  return layout == SpLayout::None ? 1 : layout == SpLayout::Contiguous ? world : 2 * int64_t(world);
}

int64_t sp_padded_length(int64_t L, SpLayout layout, int world, int inner) {
  EASYCTX_CHECK(L > 0 && world > 0, "sp_padded_length: L ", L, ", world ", world);
  EASYCTX_CHECK(layout != SpLayout::Usp || (inner > 0 && world % inner == 0), "sp_padded_length: usp inner size ",
                inner, " does not divide ", world);
  const int64_t m = sp_length_multiple(layout, world);
  return (L + m - 1) / m * m;
}

int64_t sp_local_length(int64_t L, SpLayout layout, int world, int inner) {
  if (layout == SpLayout::None) return L;
  return sp_padded_length(L, layout, world, inner) / world;
}

}  // namespace easyctx
