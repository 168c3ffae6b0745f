#include "common/attention/partial_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>

namespace magicpig::attention {

PartialAttention EmptyPartial(int64_t d) {
  PartialAttention p;
  p.o.assign(static_cast<size_t>(d), 0.0f);
  return p;
}

PartialAttention MergePartials(std::span<const PartialAttention> parts) {
  size_t d = 0;
  int64_t touched = 0;
  double m = -std::numeric_limits<double>::infinity();
  for (const PartialAttention& p : parts) {
    d = std::max(d, p.o.size());
    touched += p.n_touched;
    if (!p.empty()) m = std::max(m, static_cast<double>(p.lse));
  }
  PartialAttention out = EmptyPartial(static_cast<int64_t>(d));
  out.n_touched = touched;
  if (!(m > -std::numeric_limits<double>::infinity())) return out;  // all parts empty

  // m is finite here unless some lse is +inf; then the merge is undefined and lse stays +inf.
  double sum = 0.0;
  for (const PartialAttention& p : parts) {
    if (!p.empty()) sum += std::exp(static_cast<double>(p.lse) - m);
  }
  const double lse = m + std::log(sum);
  std::vector<double> acc(d, 0.0);
  for (const PartialAttention& p : parts) {
    if (p.empty()) continue;
    assert(p.o.size() == d);
    const double w = std::exp(static_cast<double>(p.lse) - lse);
    for (size_t i = 0; i < d; ++i) acc[i] += w * static_cast<double>(p.o[i]);
  }
  for (size_t i = 0; i < d; ++i) out.o[i] = static_cast<float>(acc[i]);
  out.lse = static_cast<float>(lse);
  return out;
}

}  // namespace magicpig::attention
