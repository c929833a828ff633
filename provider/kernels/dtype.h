// Element types of the op's T and scalar conversions to and from float.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace hinamoe {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };
constexpr int kNumDTypes = 3;

constexpr float INFINITY_F = std::numeric_limits<float>::infinity();

// The storage type of one element: float, or the 16 bits of a half / bfloat16.
template <DType DT> struct Elem { using T = uint16_t; };
template <> struct Elem<DType::F32> { using T = float; };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::F32 ? "float32" : t == DType::F16 ? "float16" : "bfloat16";
}

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE binary16 <-> binary32, exact for every half value, RNE on the way down.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

inline float load_as_f32(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}
inline void store_from_f32(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    default: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
  }
}

}  // namespace hinamoe
