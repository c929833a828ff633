// The bf16 tile GEMM over quantised weights (amx/qgemm_tiles.h): the panel
// dequantisation and the token transform, AVX512-BF16 against the scalar
// versions byte for byte; the GEMM on the emulator (and on real AMX where
// this CPU has it) against a float64 dot of the bf16-rounded operands;
// outputs poisoned with NaN before the kernel writes them.
#include <cmath>
#include <cstring>

#include "amx/amx_detect.h"
#include "amx/amx_layout.h"
#include "amx/qgemm_tiles.h"
#include "qmoe/qmoe_test_helpers.h"

using namespace hinamoe;
using namespace hinamoe::qt;

namespace {

double bf16_round(double v) { return double(bf16_to_f32(f32_to_bf16(float(v)))); }

// w(n, k) as the panel holds it: (float(q) - float(zp)) * scale in float32, then bf16.
double w_bf16(const QW& w, const QWeight& v, int64_t n, int64_t k) {
  const int64_t b = v.nb == 1 ? 0 : k / v.block;
  const float f = (float(v.code(n, k)) - float(v.zero_point(n, b))) * v.scale(n, b);
  (void)w;
  return bf16_round(f);
}

// Tokens of M rows (k order) into the 32-token VNNI blocks the kernel reads.
std::vector<uint16_t> token_blocks(const std::vector<float>& X, int64_t M, int64_t K, bool avx512) {
  const int64_t Kp = (K + 31) / 32 * 32;
  std::vector<uint16_t> xv(size_t(M * Kp), 0xffff);
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int n = int(std::min<int64_t>(16, M - m0));
    const int64_t mb = m0 / 32 * 32, mt = std::min<int64_t>(32, M - mb);
    const float* rows[16];
    for (int i = 0; i < n; ++i) rows[i] = X.data() + (m0 + i) * K;
    uint32_t* dst = reinterpret_cast<uint32_t*>(xv.data() + mb * Kp) + (m0 - mb);
    (avx512 ? vnni_rows16_avx512 : vnni_rows16_ref)(rows, n, K, Kp, dst, mt);
  }
  return xv;
}

}  // namespace

TEST(tiles_dequant_and_tokens_avx512_match_scalar) {
  if (!avx512_bf16_unavailable_reason().empty()) return;
  for (int bits : {4, 8})
    for (int64_t block : {0, 16, 32, 128}) {
      const int64_t K = block ? block * ht::randint(1, 5) - 2 * ht::randint(0, 7) : 2 * ht::randint(1, 200);
      const QW w = make_qw(bits, 32, K, block, ht::randint(0, 1) == 1, int(ht::randint(0, 2)));
      const int64_t Kp = (K + 31) / 32 * 32;
      std::vector<uint16_t> a(size_t(32 * Kp), 0x7fc1), b(size_t(32 * Kp), 0x7fc2);
      const int rows = int(ht::randint(1, 32));
      dequant_rows_bf16_ref(w.view(), 0, rows, Kp, a.data());
      dequant_rows_bf16_avx512(w.view(), 0, rows, Kp, b.data());
      for (int r = 0; r < rows; ++r)
        for (int64_t k = 0; k < Kp; ++k) {
          const size_t i = size_t((k / 32) * 1024 + r * 32 + k % 32);
          CHECK_MSG(a[i] == b[i], "dequant bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                                      " r=" + std::to_string(r) + " k=" + std::to_string(k));
        }
      const int64_t M = ht::randint(1, 70);
      std::vector<float> X(size_t(M * K));
      for (auto& v : X) v = float(ht::uniform(-3, 3));
      CHECK(token_blocks(X, M, K, false) == token_blocks(X, M, K, true));
    }
}

TEST(tiles_gemm_matches_bf16_float64) {
  std::vector<std::pair<const char*, QGemmTilesFn>> kernels{{"emu", qgemm_tiles_emu}};
  if (amx_unavailable_reason().empty() && avx512_bf16_unavailable_reason().empty())
    kernels.push_back({"amx", qgemm_tiles_amx});
  for (const auto& [name, fn] : kernels)
    for (int bits : {4, 8})
      for (int64_t block : {0, 16, 32, 64}) {
        const int64_t N = ht::randint(1, 70), M = ht::randint(1, 80);
        const int64_t K = block ? block * ht::randint(1, 6) - 2 * ht::randint(0, 7) : 2 * ht::randint(1, 150);
        const QW w = make_qw(bits, N, K, block, ht::randint(0, 1) == 1, int(ht::randint(0, 2)));
        const QWeight v = w.view();
        std::vector<float> X(size_t(M * K));
        for (auto& x : X) x = float(ht::uniform(-1, 1));
        const std::vector<uint16_t> xv = token_blocks(X, M, K, false);
        const int64_t n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
        const int64_t ldy = (n1 - n0) + ht::randint(0, 3);
        std::vector<float> Y(size_t(M * ldy), std::nanf(""));
        fn(v, n0, n1, xv.data(), M, Y.data(), ldy);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double t = w_bf16(w, v, n, k) * bf16_round(X[size_t(m * K + k)]);
              ref += t;
              mag += std::fabs(t);
            }
            const double got = Y[size_t(m * ldy + n - n0)];
            CHECK_MSG(std::fabs(got - ref) <= 1e-6 * mag + 1e-7,
                      std::string(name) + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                          " K=" + std::to_string(K) + " M=" + std::to_string(M) + " got " + std::to_string(got) +
                          " want " + std::to_string(ref));
          }
        for (int64_t m = 0; m < M; ++m)  // the padding of each Y row untouched
          for (int64_t c = n1 - n0; c < ldy; ++c) CHECK(std::isnan(Y[size_t(m * ldy + c)]));
      }
}
