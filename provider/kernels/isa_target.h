// Target attributes of the per-ISA kernels. The library is compiled for
// the baseline x86-64; each tier's functions carry their ISA as a target
// attribute, so every tier builds in one library and the dispatch picks
// one at run time (cpu_features.cc). One spelling per ISA, used by every
// kernel family.
#pragma once

#define HINAMOE_AVX2_TARGET "avx2,fma,f16c"
#define HINAMOE_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"

#define HINAMOE_AVX2_FN __attribute__((target(HINAMOE_AVX2_TARGET)))
#define HINAMOE_AVX2_INLINE __attribute__((target(HINAMOE_AVX2_TARGET), always_inline)) inline
// AVX-VNNI: vpdpbusd on ymm, VEX encoded (Alder Lake, Sapphire Rapids, Zen 5).
#define HINAMOE_AVX2_VNNI_FN __attribute__((target(HINAMOE_AVX2_TARGET ",avxvnni")))
#define HINAMOE_AVX2_VNNI_INLINE __attribute__((target(HINAMOE_AVX2_TARGET ",avxvnni"), always_inline)) inline

#define HINAMOE_AVX512_FN __attribute__((target(HINAMOE_AVX512_TARGET)))
#define HINAMOE_AVX512_INLINE __attribute__((target(HINAMOE_AVX512_TARGET), always_inline)) inline
#define HINAMOE_AVX512_VNNI_FN __attribute__((target(HINAMOE_AVX512_TARGET ",avx512vnni")))
// AVX512-BF16: vdpbf16ps (pairs of bfloat16 products summed into float32).
#define HINAMOE_AVX512_BF16_FN __attribute__((target(HINAMOE_AVX512_TARGET ",avx512bf16")))
#define HINAMOE_AVX512_BF16_INLINE __attribute__((target(HINAMOE_AVX512_TARGET ",avx512bf16"), always_inline)) inline
