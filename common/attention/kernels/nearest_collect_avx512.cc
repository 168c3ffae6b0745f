// AVX-512 BW build (compiled with those flags only here) of CollectNearest: 32 distances per
// compare into a 32-bit lane mask (vpcmpuw), the last n % 32 read under a mask; selected lanes
// emitted from the mask.
#include <immintrin.h>

#include "common/attention/kernels/nearest_collect.h"

namespace magicpig::attention::internal {

int64_t CollectNearestAvx512(const NearestCollect& a, int32_t* out) {
  const __m512i vt = _mm512_set1_epi16(static_cast<int16_t>(a.t));
  const __m512i vtop = _mm512_set1_epi16(static_cast<int16_t>(a.top));
  int64_t c = 0;
  int64_t ties = a.ties;
  for (int64_t i = 0; i < a.n && c < a.want; i += 32) {
    const int64_t left = a.n - i;
    const __mmask32 valid =
        left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << left) - 1);
    const __m512i x = _mm512_min_epu16(_mm512_maskz_loadu_epi16(valid, a.distances + i), vtop);
    const uint32_t lt = _mm512_mask_cmplt_epu16_mask(valid, x, vt);
    const uint32_t eq = ties > 0 ? _mm512_mask_cmpeq_epu16_mask(valid, x, vt) : 0;
    if ((lt | eq) == 0) continue;
    c = EmitLanes(lt, eq, i, &ties, out, c, a.want);
  }
  return c;
}

}  // namespace magicpig::attention::internal
