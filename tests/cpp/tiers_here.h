// The kernel tiers this CPU runs, for tests that loop over every tier.
#pragma once

#include <string>
#include <vector>

#include "tier.h"

inline std::vector<const hinamoe::KernelTier*> tiers_here() {
  std::vector<const hinamoe::KernelTier*> v;
  for (const std::string& n : hinamoe::supported_tiers()) v.push_back(hinamoe::select_tier(n, nullptr));
  return v;
}
