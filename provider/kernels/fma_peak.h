// Float FMA-rate probe: the compute roofline beside the bandwidth one. At n
// tokens per expert every weight element takes n FMAs, so the weight stream
// cannot run faster than (this rate / n) elements per second, whatever the
// memory does.
#pragma once

namespace hinamoe {

// Lane-FMAs per second (one 8-wide FMA = 8) that `threads` std::threads
// reach together on independent FMA chains of `bits` (256 or 512: the
// vectors of the avx2 / avx512 tiers) -- the issue-rate peak, best of a few
// short rounds. 0 where the CPU lacks them (AVX2/FMA, AVX-512F).
double fma_peak_per_s(int threads, int bits = 256);

}  // namespace hinamoe
