#include "kernel_base.h"

#include <sstream>

namespace hinamoe_ep {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

void ort_parallel_for(void* pool, size_t n, void (*fn)(void*, size_t), void* arg) {
  static_cast<const Ort::KernelContext*>(pool)->ParallelFor(fn, n, 0, arg);
}

}  // namespace hinamoe_ep
