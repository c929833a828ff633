// Per-node segment table of a weight [N rows, K cols] (row-major, never
// repacked) under a page -> node placement (paper §5.2, DESIGN.md §4).
//
// Addressing. Elements are `elem_bits` wide (32 f32, 16 f16/bf16, 8 int8,
// 4 int4 = two per byte, low nibble first, rows packed back to back). The
// buffer starts `offset` bytes into its first page; element (x, y) occupies
// bits [offset*8 + (x*K + y)*bits, +bits) and so page
//     page(x, y) = (offset*8 + (x*K + y)*bits) / (8*P)
// counted from the buffer's first page. `offset` must be a multiple of the
// element size (whole bytes for int4), so no element straddles a page and,
// for int4, page boundaries (byte boundaries) never split a byte: k indices
// are always in elements.
//
// Interleaved placement: page p is on node (p + first_node) mod Nn. With
// row_bits = K*bits and L = 8*P*Nn, row x+Tx has exactly the layout of row x
// shifted by whole rounds of Nn pages when Tx*row_bits is a multiple of L:
//     Tx = L / gcd(row_bits, L)      (= P*Nn / gcd(row_bytes, P*Nn) for
//                                      byte-sized rows; the paper's
//                                      2048*Nn / gcd(K, 2048*Nn) for bf16)
// so a table over rows [0, min(Tx, N)) describes the whole weight: row x uses
// the segments of row x mod period_rows.
//
// Segments are half-open element ranges (row, k_start, k_end); within a row
// they are ascending, cover [0, K) exactly once across nodes, each lies on
// pages of one node, and adjacent pages of the same node are merged (so a
// one-node table has one segment [0, K) per row).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "page_query.h"

namespace hinamoe {
namespace numa {

struct Segment {
  int64_t row = 0;
  int64_t k_start = 0;
  int64_t k_end = 0;
};

inline bool operator==(const Segment& a, const Segment& b) {
  return a.row == b.row && a.k_start == b.k_start && a.k_end == b.k_end;
}

struct SegmentTable {
  int64_t rows = 0;       // N
  int64_t cols = 0;       // K
  int elem_bits = 0;      // 32, 16, 8 or 4
  int nodes = 1;          // Nn
  int64_t page_size = 0;  // P, bytes
  int64_t offset = 0;     // bytes of the buffer's start within its first page
  int first_node = 0;     // node of the buffer's first page (interleaved model)
  bool periodic = true;   // false: built from a page map; period_rows == rows
  int64_t period_rows = 0;  // rows described; row x uses row x mod period_rows
  // segments[node]: that node's segments of rows [0, period_rows), row-major order.
  std::vector<std::vector<Segment>> segments;
  // row_begin[node][r] .. row_begin[node][r + 1]: indices in segments[node] of row r.
  std::vector<std::vector<int64_t>> row_begin;

  // Total number of segments over all nodes.
  int64_t total_segments() const;
};

// Element bits of a dtype name: f32/float32 -> 32, f16/float16 and
// bf16/bfloat16 -> 16, int8/uint8 -> 8, int4/uint4 -> 4; 0 when unknown.
int dtype_bits(const std::string& name);

// Checks the parameters of a table; "" when valid, else the reason.
// rows, cols >= 1; elem_bits in {4, 8, 16, 32}; 1 <= nodes <= 1024;
// page_size a positive multiple of the element size (<= 2^40);
// 0 <= offset < page_size and a multiple of the element size;
// 0 <= first_node < nodes.
std::string validate_table_params(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                  int64_t offset, int first_node = 0);

// Tx = 8*P*Nn / gcd(cols*elem_bits, 8*P*Nn), capped at rows. Parameters must be valid.
int64_t period_rows(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size);

// Pages the buffer spans, counted from its first page.
int64_t pages_spanned(int64_t rows, int64_t cols, int elem_bits, int64_t page_size, int64_t offset);

// The table under page interleaving over `nodes` starting at `first_node`.
// Returns "" on success, else the reason (bad parameters, or a table over
// 2^24 segments).
std::string build_interleaved_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                    int64_t offset, int first_node, SegmentTable* out);

// The table for an arbitrary placement (first-touch, bound memory): queries
// node_of(p) exactly once per page p in [0, pages_spanned) and describes
// every row (periodic = false, period_rows = rows). Pages reported unknown
// (-1) or >= nodes are assigned round-robin (p mod nodes) so work stays
// spread; locality of those pages is unknown anyway.
std::string build_page_map_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                 int64_t offset, const PageNodeFn& node_of, SegmentTable* out);

// Same, from page nodes already queried: page_nodes[p] for p in [0, pages_spanned).
std::string build_page_map_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                 int64_t offset, const std::vector<int>& page_nodes, SegmentTable* out);

// One node (or placement ignored): period 1, row 0 -> [0, cols) on node 0.
SegmentTable single_node_table(int64_t rows, int64_t cols, int elem_bits);

// t with every boundary inside a row moved to the nearest multiple of
// `granule` elements (0 and cols stay put; granule >= 1): segments left
// empty vanish and neighbours on one node merge, so each row is still
// covered exactly once. For kernels that can cut a row only at block
// boundaries (QMoE's scale blocks); locality drops by at most granule / 2
// elements per page boundary. granule >= cols gives each row to one node.
SegmentTable snap_segments(const SegmentTable& t, int64_t granule);

}  // namespace numa
}  // namespace hinamoe
