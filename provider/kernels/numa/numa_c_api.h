/* C ABI of the NUMA segment planner (for ctypes: hinamoe.numa_plan).
 *
 * hinamoe_numa_plan describes weight [rows, cols] of `dtype` ("f32", "f16",
 * "bf16", "int8", "int4"; also "float32", "float16", "bfloat16", "uint8",
 * "uint4") under page interleaving over `nodes` nodes, the buffer starting
 * `offset` bytes into its first page and that page on node 0:
 *   *period_rows      <- Tx = 8*P*Nn / gcd(cols*bits, 8*P*Nn), capped at rows
 *   counts[n]         <- number of segments of node n, n < nodes
 *   segments[3*i ..]  <- (row, k_start, k_end) triples, half-open element
 *                        ranges, for rows 0..period_rows-1: node 0's
 *                        segments first (rows ascending, k ascending), then
 *                        node 1's, ...; counts[] gives the split.
 * No memory is allocated for the caller; the call is pure and thread-safe.
 *
 * Two-call protocol:
 *   1. segments == NULL (capacity ignored): fills *period_rows and counts,
 *      returns 0. total = sum(counts).
 *   2. segments with capacity >= total triples: fills everything, returns 0.
 *      capacity < total: fills *period_rows and counts, leaves segments
 *      untouched, returns HINAMOE_NUMA_E_CAPACITY.
 *
 * Returns 0 on success; HINAMOE_NUMA_E_ARGS on bad arguments (rows or
 * cols < 1, unknown dtype, nodes not in [1, 1024], page_size not a positive
 * multiple of the element size, offset outside [0, page_size) or not a
 * multiple of the element size, null period_rows/counts, table over 2^24
 * segments) with a NUL-terminated message in error[0..error_size) (when
 * error is non-null and error_size > 0; truncated to fit).
 *
 * ctypes sketch:
 *   f = lib.hinamoe_numa_plan
 *   f.argtypes = [c_int64, c_int64, c_char_p, c_int, c_int64, c_int64,
 *                 POINTER(c_int64), POINTER(c_int64), POINTER(c_int64),
 *                 c_int64, c_char_p, c_size_t]
 *   period = c_int64(); counts = (c_int64 * nodes)(); err = create_string_buffer(512)
 *   rc = f(rows, cols, b"bf16", nodes, 4096, 0, byref(period), counts, None, 0, err, 512)
 *   segs = (c_int64 * (3 * sum(counts)))()
 *   rc = f(rows, cols, b"bf16", nodes, 4096, 0, byref(period), counts, segs, sum(counts), err, 512)
 */
#ifndef HINAMOE_NUMA_C_API_H_
#define HINAMOE_NUMA_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define HINAMOE_NUMA_API __declspec(dllexport)
#else
#define HINAMOE_NUMA_API __attribute__((visibility("default")))
#endif

#define HINAMOE_NUMA_OK 0
#define HINAMOE_NUMA_E_ARGS 1
#define HINAMOE_NUMA_E_CAPACITY 2

#ifdef __cplusplus
extern "C" {
#endif

HINAMOE_NUMA_API int hinamoe_numa_plan(int64_t rows, int64_t cols, const char* dtype, int nodes, int64_t page_size,
                                       int64_t offset, int64_t* period_rows, int64_t* counts, int64_t* segments,
                                       int64_t capacity, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* HINAMOE_NUMA_C_API_H_ */
