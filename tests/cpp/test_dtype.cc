// f16/bf16 <-> f32 conversions against first-principles decoding and a
// double-precision round-to-nearest-even.
#include "dtype.h"
#include "test_util.h"

using namespace hinamoe;

namespace {

// Round a float to half by brute force: nearest of the two neighbours in
// value, ties to the even code. Independent of the library's bit tricks.
uint16_t f16_rne_ref(float f) {
  if (std::isnan(f)) return 0x7e00;
  const double v = f;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(v);
  // Largest code with value <= a.
  int lo = 0, hi = 0x7c00;  // inf
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ht::half_value(uint16_t(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  if (lo == 0x7c00) return sign | 0x7c00;
  const double below = ht::half_value(uint16_t(lo));
  // Above max half the next "code" is infinity at 65536 for rounding purposes.
  const double above = lo == 0x7bff ? 65536.0 : ht::half_value(uint16_t(lo + 1));
  int pick;
  if (a - below < above - a) pick = lo;
  else if (a - below > above - a) pick = lo + 1;
  else pick = (lo & 1) ? lo + 1 : lo;
  if (pick > 0x7bff) pick = 0x7c00;
  return uint16_t(sign | pick);
}

}  // namespace

TEST(dtype_f16_to_f32_all) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const double want = ht::half_value(uint16_t(h));
    const bool ok = std::isnan(want) ? std::isnan(f) : (double(f) == want && std::signbit(f) == bool(h & 0x8000));
    if (!ok && bad++ < 5) ht::check(false, ht::fmt("f16 0x%04x -> %.9g, want %.9g", h, f, want));
  }
  ht::check(bad == 0, ht::fmt("%d f16 codes decode wrong", bad));
}

TEST(dtype_f32_to_f16_rne) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e10f,
                           -1e10f, INFINITY, -INFINITY, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                           8.940697e-08f, 6.1035156e-05f, 6.1035152e-05f, 6.0975550e-05f, 1e-30f, 1.00048828125f,
                           1.00146484375f, 2049.0f, 2051.0f, std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns concentrated on the half range, plus exact ties.
    const uint32_t u = uint32_t(ht::randint(0, 0xffffffffLL));
    float f = ht::bitsf(u);
    if (i % 3 == 0) f = float(ht::uniform(-70000, 70000));
    if (i % 3 == 1) f = float(std::ldexp(ht::uniform(-2, 2), int(ht::randint(-26, 16))));
    if (i % 7 == 0) f = float(ht::half_value(uint16_t(ht::randint(0, 0x7bff)))) +
                        float(std::ldexp(1.0, int(ht::randint(-25, 4))));  // near ties
    xs.push_back(f);
  }
  int bad = 0;
  for (float f : xs) {
    const uint16_t got = f32_to_f16(f), want = f16_rne_ref(f);
    const bool ok = std::isnan(f) ? ((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0) : got == want;
    if (!ok && bad++ < 5) ht::check(false, ht::fmt("f32 %.9g (0x%08x) -> 0x%04x, want 0x%04x", f, ht::fbits(f), got, want));
  }
  ht::check(bad == 0, ht::fmt("%d of %zu f32->f16 conversions wrong", bad, xs.size()));
}

TEST(dtype_bf16) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (ht::fbits(f) != (h << 16)) ++bad;
    if (!std::isnan(f) && f32_to_bf16(f) != h) ++bad;
  }
  ht::check(bad == 0, ht::fmt("%d bf16 round trips wrong", bad));
  // RNE: 1 + 2^-8 is a tie between 1 and 1+2^-7 -> even (1.0).
  ht::check(f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even (down)");
  ht::check(f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie to even (up)");
  ht::check(std::isnan(bf16_to_f32(f32_to_bf16(NAN))), "bf16 NaN stays NaN");
  ht::check(f32_to_bf16(3.4e38f) == 0x7f80, "bf16 overflow rounds to inf");
}
