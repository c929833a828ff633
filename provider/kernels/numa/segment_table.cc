// Segment tables: period, validation, interleaved and page-map builders.
#include "segment_table.h"

#include <algorithm>

namespace hinamoe {
namespace numa {

namespace {

constexpr int64_t kMaxDim = int64_t(1) << 40;
constexpr int64_t kMaxSegments = int64_t(1) << 24;
constexpr int kMaxNodes = 1024;

int64_t gcd64(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// Walks the pages of each row and appends merged segments per node.
// start_bit(x): bit position of element (x, 0) counted from the first page's
// start (any value congruent modulo a whole round of pages for the
// interleaved model). node_of_page(p): node of page p, in [0, nodes).
template <class StartBit, class NodeOf>
void fill_table(SegmentTable* t, StartBit start_bit, NodeOf node_of_page) {
  const int64_t page_bits = t->page_size * 8;
  const int64_t bits = t->elem_bits;
  const size_t nn = static_cast<size_t>(t->nodes);
  t->segments.assign(nn, {});
  t->row_begin.assign(nn, std::vector<int64_t>(static_cast<size_t>(t->period_rows) + 1, 0));
  for (int64_t x = 0; x < t->period_rows; ++x) {
    for (size_t n = 0; n < nn; ++n) t->row_begin[n][static_cast<size_t>(x)] = static_cast<int64_t>(t->segments[n].size());
    const int64_t s = start_bit(x);
    int prev = -1;
    for (int64_t y = 0; y < t->cols;) {
      const int64_t b = s + y * bits;
      const int64_t page = b / page_bits;
      const int64_t y1 = std::min(t->cols, y + ((page + 1) * page_bits - b) / bits);
      const int node = node_of_page(page);
      auto& list = t->segments[static_cast<size_t>(node)];
      if (node == prev) list.back().k_end = y1;
      else list.push_back(Segment{x, y, y1});
      prev = node;
      y = y1;
    }
  }
  for (size_t n = 0; n < nn; ++n)
    t->row_begin[n][static_cast<size_t>(t->period_rows)] = static_cast<int64_t>(t->segments[n].size());
}

// Upper bound of the segments a table over `rows` rows can hold.
int64_t segment_bound(int64_t rows, int64_t cols, int elem_bits, int64_t page_size) {
  const int64_t per_row = cols * elem_bits / (page_size * 8) + 2;
  return rows > kMaxSegments / per_row ? kMaxSegments + 1 : rows * per_row;
}

void set_header(SegmentTable* t, int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                int64_t offset, int first_node, bool periodic, int64_t period) {
  t->rows = rows;
  t->cols = cols;
  t->elem_bits = elem_bits;
  t->nodes = nodes;
  t->page_size = page_size;
  t->offset = offset;
  t->first_node = first_node;
  t->periodic = periodic;
  t->period_rows = period;
}

}  // namespace

int64_t SegmentTable::total_segments() const {
  int64_t n = 0;
  for (const auto& s : segments) n += static_cast<int64_t>(s.size());
  return n;
}

int dtype_bits(const std::string& name) {
  if (name == "f32" || name == "float32") return 32;
  if (name == "f16" || name == "float16" || name == "bf16" || name == "bfloat16") return 16;
  if (name == "int8" || name == "uint8") return 8;
  if (name == "int4" || name == "uint4") return 4;
  return 0;
}

std::string validate_table_params(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                  int64_t offset, int first_node) {
  if (rows < 1 || rows > kMaxDim) return "rows must be in [1, 2^40], got " + std::to_string(rows);
  if (cols < 1 || cols > kMaxDim) return "cols must be in [1, 2^40], got " + std::to_string(cols);
  if (elem_bits != 4 && elem_bits != 8 && elem_bits != 16 && elem_bits != 32)
    return "element bits must be 4, 8, 16 or 32, got " + std::to_string(elem_bits);
  if (nodes < 1 || nodes > kMaxNodes) return "nodes must be in [1, 1024], got " + std::to_string(nodes);
  const int64_t esize_bytes = elem_bits >= 8 ? elem_bits / 8 : 1;
  if (page_size < 1 || page_size > kMaxDim || page_size % esize_bytes != 0)
    return "page_size must be a positive multiple of the element size (" + std::to_string(esize_bytes) +
           " bytes), got " + std::to_string(page_size);
  if (offset < 0 || offset >= page_size)
    return "offset must be in [0, page_size) = [0, " + std::to_string(page_size) + "), got " + std::to_string(offset);
  if (offset % esize_bytes != 0)
    return "offset must be a multiple of the element size (" + std::to_string(esize_bytes) + " bytes), got " +
           std::to_string(offset);
  if (first_node < 0 || first_node >= nodes)
    return "first_node must be in [0, nodes), got " + std::to_string(first_node);
  // Bit addresses of the whole buffer must fit in int64.
  if (rows > (int64_t(1) << 58) / cols / elem_bits) return "weight too large (rows * cols * bits >= 2^58)";
  return "";
}

int64_t period_rows(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size) {
  const int64_t round_bits = page_size * 8 * nodes;  // <= 2^53
  const int64_t row_bits = cols * elem_bits;          // <= 2^45
  const int64_t tx = round_bits / gcd64(row_bits, round_bits);
  return std::min(tx, rows);
}

int64_t pages_spanned(int64_t rows, int64_t cols, int elem_bits, int64_t page_size, int64_t offset) {
  const int64_t end_bits = offset * 8 + rows * cols * elem_bits;
  const int64_t page_bits = page_size * 8;
  return (end_bits + page_bits - 1) / page_bits;
}

std::string build_interleaved_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                    int64_t offset, int first_node, SegmentTable* out) {
  std::string err = validate_table_params(rows, cols, elem_bits, nodes, page_size, offset, first_node);
  if (!err.empty()) return err;
  const int64_t period = period_rows(rows, cols, elem_bits, nodes, page_size);
  if (segment_bound(period, cols, elem_bits, page_size) > kMaxSegments)
    return "segment table too large (over 2^24 segments): period " + std::to_string(period) + " rows";
  set_header(out, rows, cols, elem_bits, nodes, page_size, offset, first_node, true, period);
  // Start bit of row x reduced modulo one round of pages (8*P*Nn bits):
  // shifting by whole rounds keeps both the node and the position in the page.
  const int64_t round_bits = page_size * 8 * nodes;
  const int64_t row_mod = (cols * elem_bits) % round_bits;
  fill_table(
      out,
      [&](int64_t x) {
        const unsigned __int128 p = static_cast<unsigned __int128>(x) * static_cast<unsigned __int128>(row_mod);
        return offset * 8 + static_cast<int64_t>(p % static_cast<unsigned __int128>(round_bits));
      },
      [&](int64_t page) { return static_cast<int>((page + first_node) % nodes); });
  return "";
}

std::string build_page_map_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                 int64_t offset, const std::vector<int>& page_nodes, SegmentTable* out) {
  std::string err = validate_table_params(rows, cols, elem_bits, nodes, page_size, offset);
  if (!err.empty()) return err;
  const int64_t pages = pages_spanned(rows, cols, elem_bits, page_size, offset);
  if (static_cast<int64_t>(page_nodes.size()) < pages)
    return "page map has " + std::to_string(page_nodes.size()) + " pages, the weight spans " + std::to_string(pages);
  if (segment_bound(rows, cols, elem_bits, page_size) > kMaxSegments)
    return "segment table too large (over 2^24 segments): " + std::to_string(rows) + " rows";
  set_header(out, rows, cols, elem_bits, nodes, page_size, offset, 0, false, rows);
  const int64_t row_bits = cols * elem_bits;
  fill_table(
      out, [&](int64_t x) { return offset * 8 + x * row_bits; },
      [&](int64_t page) {
        const int n = page_nodes[static_cast<size_t>(page)];
        return (n >= 0 && n < nodes) ? n : static_cast<int>(page % nodes);
      });
  return "";
}

std::string build_page_map_table(int64_t rows, int64_t cols, int elem_bits, int nodes, int64_t page_size,
                                 int64_t offset, const PageNodeFn& node_of, SegmentTable* out) {
  std::string err = validate_table_params(rows, cols, elem_bits, nodes, page_size, offset);
  if (!err.empty()) return err;
  if (segment_bound(rows, cols, elem_bits, page_size) > kMaxSegments)
    return "segment table too large (over 2^24 segments): " + std::to_string(rows) + " rows";
  const int64_t pages = pages_spanned(rows, cols, elem_bits, page_size, offset);
  std::vector<int> map(static_cast<size_t>(pages));
  for (int64_t p = 0; p < pages; ++p) map[static_cast<size_t>(p)] = node_of(p);  // once per page
  return build_page_map_table(rows, cols, elem_bits, nodes, page_size, offset, map, out);
}

SegmentTable single_node_table(int64_t rows, int64_t cols, int elem_bits) {
  SegmentTable t;
  set_header(&t, rows, cols, elem_bits, 1, 0, 0, 0, true, rows > 0 ? 1 : 0);
  t.segments.assign(1, {});
  if (rows > 0) t.segments[0].push_back(Segment{0, 0, cols});
  t.row_begin.assign(1, std::vector<int64_t>{0, static_cast<int64_t>(t.segments[0].size())});
  if (rows <= 0) t.row_begin[0].assign(1, 0);
  return t;
}

SegmentTable snap_segments(const SegmentTable& t, int64_t granule) {
  if (granule <= 1) return t;
  SegmentTable out = t;
  const int64_t K = t.cols;
  auto snap = [&](int64_t b) { return b >= K ? K : std::min(K, (b + granule / 2) / granule * granule); };
  struct Piece {
    int64_t k0, k1;
    int node;
  };
  std::vector<Piece> row;
  for (auto& s : out.segments) s.clear();
  for (auto& rb : out.row_begin) rb.assign(1, 0);
  for (int64_t r = 0; r < t.period_rows; ++r) {
    row.clear();
    for (int n = 0; n < t.nodes; ++n)
      for (int64_t i = t.row_begin[size_t(n)][size_t(r)]; i < t.row_begin[size_t(n)][size_t(r) + 1]; ++i) {
        const Segment& sg = t.segments[size_t(n)][size_t(i)];
        row.push_back({sg.k_start, sg.k_end, n});
      }
    std::sort(row.begin(), row.end(), [](const Piece& a, const Piece& b) { return a.k0 < b.k0; });
    std::vector<Piece> kept;
    for (const Piece& p : row) {
      const int64_t k0 = snap(p.k0), k1 = snap(p.k1);
      if (k1 <= k0) continue;
      if (!kept.empty() && kept.back().node == p.node && kept.back().k1 == k0) {
        kept.back().k1 = k1;
      } else {
        kept.push_back({k0, k1, p.node});
      }
    }
    for (const Piece& p : kept) out.segments[size_t(p.node)].push_back(Segment{r, p.k0, p.k1});
    for (int n = 0; n < t.nodes; ++n)
      out.row_begin[size_t(n)].push_back(int64_t(out.segments[size_t(n)].size()));
  }
  return out;
}

}  // namespace numa
}  // namespace hinamoe
