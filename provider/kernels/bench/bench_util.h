// Small helpers both kernel micro-benchmarks use.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace hinamoe::bench {

// Seconds on a monotonic clock.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "a,b,,c" -> {"a", "b", "c"}: the comma lists of the command lines.
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace hinamoe::bench
