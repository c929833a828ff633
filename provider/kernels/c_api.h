/* C ABI of libhinamoe_kernels.so: tier queries, a bandwidth probe and a
 * direct MoE call for tests and benchmarks without ONNX Runtime (ctypes). */
#ifndef HINAMOE_C_API_H_
#define HINAMOE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define HINAMOE_API __declspec(dllexport)
#else
#define HINAMOE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Median read bandwidth in GB/s over `repeats` passes of a `bytes` buffer
 * streamed by `threads` threads; 0 on allocation failure. */
HINAMOE_API double hinamoe_read_bandwidth_gbs(size_t bytes, int threads, int repeats);

/* A persistent read-bandwidth probe (provider/kernels/bandwidth.h ReadProbe):
 * its buffer and reader threads are set up once, and each pass is timed on
 * its own, so a benchmark can take one pass after each timed run. */
typedef struct HinamoeReadProbe HinamoeReadProbe;

/* Allocates and first-touches about `bytes` split over `threads` reader
 * threads. Returns 0 and sets *out on success; 1 on a bad argument (bytes
 * == 0, threads outside [1, 256], out NULL), 2 when the buffer or the
 * threads cannot be had; the reason goes to err[err_len] (may be NULL). */
HINAMOE_API int hinamoe_read_probe_create(size_t bytes, int threads, HinamoeReadProbe** out, char* err,
                                          size_t err_len);

/* One timed pass over the whole buffer by all threads, in GB/s (1e9 B/s);
 * 0 when probe is NULL. */
HINAMOE_API double hinamoe_read_probe_pass_gbs(HinamoeReadProbe* probe);

/* Bytes one pass streams (the request rounded to whole 256 B per thread). */
HINAMOE_API size_t hinamoe_read_probe_bytes(const HinamoeReadProbe* probe);

/* Joins the threads and frees the buffer; NULL is ignored. */
HINAMOE_API void hinamoe_read_probe_free(HinamoeReadProbe* probe);

/* Float lane-FMAs per second that `threads` threads reach together on
   independent FMA chains of `bits` (256 or 512) -- the compute roofline; 0
   where the CPU lacks them. */
HINAMOE_API double hinamoe_fma_peak_per_s(int threads, int bits);
// AMX multiply-adds per second on `threads` threads (TDPBF16PS, or TDPBUSD
// when int8 != 0); 0 where this process cannot run AMX.
HINAMOE_API double hinamoe_tile_peak_per_s(int threads, int int8);

/* Best tier this CPU runs ("amx", "avx512", "avx2" or "ref"). Static string. */
HINAMOE_API const char* hinamoe_best_tier(void);

/* "" when the tier runs here, else why not (unknown name, missing ISA).
 * Thread-local string, valid until the next call on the same thread. */
HINAMOE_API const char* hinamoe_tier_unavailable_reason(const char* name);

/* The GroupQueryAttention kernel tier that option isa = `name` runs on this
 * CPU (it can differ from the MoE tier: "auto" on an AMX CPU gives "avx2"),
 * or "" where `name` cannot run here. Static string. */
HINAMOE_API const char* hinamoe_gqa_tier(const char* name);

/* Names accepted as `tier` below ("auto, amx, avx512, avx2, ref, amx-emu"). Static string. */
HINAMOE_API const char* hinamoe_tier_names(void);

/* Runs the MoE block (see provider/kernels/moe_ffn.h for the semantics).
 * dtype: 0 float32, 1 float16, 2 bfloat16 (raw bits for 16-bit types).
 * activation: 0 relu, 1 gelu, 2 silu, 3 identity, 4 swiglu, 5 geglu, 6 relu2.
 * gate_layout: 0 separate (fc3 = up), 1 interleaved, 2 stacked.
 * Biases and fc3 may be NULL. tier: one of hinamoe_tier_names() (NULL = auto).
 * threads: how many std::threads run it (<= 1: the calling thread only).
 * Returns 0 on success; otherwise non-zero with a message in err[err_len]
 * (NUL-terminated, truncated to fit; err may be NULL). */
HINAMOE_API int hinamoe_moe_ffn(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k,
                                int activation, int gate_layout, int normalize_routing_weights, float alpha,
                                float beta, float limit, int limit_after_activation, int dtype,
                                const void* input, const void* router, const void* fc1_w, const void* fc1_b,
                                const void* fc2_w, const void* fc2_b, const void* fc3_w, const void* fc3_b,
                                void* output, const char* tier, int threads, char* err, size_t err_len);

/* hinamoe_moe_ffn with NUMA-partitioned execution (moe_ffn.h MoEOptions):
 * numa: NULL, "" or "off" = one node (exactly hinamoe_moe_ffn); "auto" or
 * "sysfs" = this machine's nodes (one node on a single-socket machine: the
 * plain path); "fake:2", "fake:4", "fake:8" = a simulated topology (pages
 * modelled as interleaved). Topologies are built once per name and kept for
 * the process. numa_page_size: page size the plans model, 0 = the system's
 * (simulation only; a positive multiple of 4 otherwise). Unknown names
 * return 2 with the accepted names in err. */
HINAMOE_API int hinamoe_moe_ffn_ex(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k,
                                   int activation, int gate_layout, int normalize_routing_weights, float alpha,
                                   float beta, float limit, int limit_after_activation, int dtype,
                                   const void* input, const void* router, const void* fc1_w, const void* fc1_b,
                                   const void* fc2_w, const void* fc2_b, const void* fc3_w, const void* fc3_b,
                                   void* output, const char* tier, int threads, const char* numa,
                                   int64_t numa_page_size, char* err, size_t err_len);

/* Number of NUMA nodes of topology `numa` (names as in hinamoe_moe_ffn_ex;
 * "off" -> 1); -1 on an unknown name, with the reason in err. */
HINAMOE_API int hinamoe_numa_nodes(const char* numa, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* HINAMOE_C_API_H_ */
