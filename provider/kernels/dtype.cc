// IEEE binary16 <-> binary32 conversions in portable integer code (the
// baseline library cannot assume F16C; the AVX2 tier converts in registers).
#include "dtype.h"

namespace hinamoe {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN (payload kept)
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24 is exact in float (man < 2^10).
  const float mag = float(man) * (1.0f / 16777216.0f);
  return bits_to_f32(sign | f32_to_bits(mag));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((u >> 13) & 0x3ffu));  // quiet NaN
  // 65520 = max half (65504) + half an ulp: from there on RNE gives infinity.
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (u < 0x38800000u) {
    // Below the smallest normal half: result is a multiple of 2^-24.
    const uint32_t e = u >> 23;
    if (e < 102) return sign;  // < 2^-25: rounds to zero (ties impossible here)
    const uint32_t m = (u & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: still correct
    return uint16_t(sign | q);
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even.
  uint32_t h = (u - 0x38000000u) >> 13;
  const uint32_t rem = u & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rolls into the exponent correctly
  return uint16_t(sign | h);
}

}  // namespace hinamoe
