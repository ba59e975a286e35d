// Block-quantized tiles in 16-lane registers, for CPUs with AVX-512 VNNI: two of the packed
// layout's column groups of 8 (kernels/block_layout.py) side by side in one register, so one
// u8 x s8 multiply-add (vpdpbusd) serves 16 output columns where the AVX2 tile serves 8. The
// layout stays the one every CPU reads; the two halves are loaded from their groups separately.
//
// A block's multiply-adds form one dependent chain, so with few rows several blocks run at once
// (kUnroll) to keep independent chains in flight.
#if TIERGATE_BLOCK_AVX512
#include <immintrin.h>

#include <cstring>
#include <type_traits>

namespace block_tiles {

inline __m512i load_pair(const void* first, const void* second) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(first))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(second)), 1);
}

inline __m512 load_pair_ps(const float* first, const float* second) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(first)), _mm256_loadu_ps(second), 1);
}

// 4 int8 activations repeated in every 32-bit lane.
inline __m512i broadcast4_512(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int MT>
constexpr int kUnroll = MT <= 2 ? 4 : MT <= 4 ? 2 : 1;

template <int MT>
void store_pair(const __m512* acc, const Output& out, int64_t m0, int64_t g) {
  float first[MT][8], second[MT][8];
  for (int t = 0; t < MT; ++t) {
    float lanes[16];
    _mm512_storeu_ps(lanes, acc[t]);
    std::memcpy(first[t], lanes, sizeof(first[t]));
    std::memcpy(second[t], lanes + 8, sizeof(second[t]));
  }
  write_group<MT>(first, out, m0, g);
  write_group<MT>(second, out, m0, g + 1);
}

// Runs blocks(unroll, b) over a row of nb blocks, U at a time, then the rest one by one.
template <int U, typename Blocks>
void over_blocks(int64_t nb, Blocks blocks) {
  int64_t b = 0;
  for (; b + U <= nb; b += U) blocks(std::integral_constant<int, U>{}, b);
  for (; b < nb; ++b) blocks(std::integral_constant<int, 1>{}, b);
}

// 4-bit groups g and g + 1 (q4_groups' layout and arithmetic) for rows m0 .. m0 + MT.
template <int MT>
void q4_pair(const uint8_t* wq, const float* wd, const float* wm, const Activations& a, int64_t K, int64_t m0,
             int64_t g, const Output& out) {
  const int64_t nb = K / kBlock;
  const uint8_t* w0 = wq + g * nb * 128;
  const uint8_t* w1 = w0 + nb * 128;
  const float* d0 = wd + g * nb * 8;
  const float* d1 = d0 + nb * 8;
  const float* n0 = wm + g * nb * 8;
  const float* n1 = n0 + nb * 8;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm512_setzero_ps();
  over_blocks<kUnroll<MT>>(nb, [&](auto unroll, int64_t b0) {
    constexpr int U = decltype(unroll)::value;
    __m512i isum[U][MT];
    for (int u = 0; u < U; ++u)
      for (int t = 0; t < MT; ++t) isum[u][t] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u;
        const __m512i raw = load_pair(w0 + b * 128 + 32 * j, w1 + b * 128 + 32 * j);
        const __m512i lo = _mm512_and_si512(raw, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        for (int t = 0; t < MT; ++t) {
          const int8_t* xb = a.q + (m0 + t) * K + b * kBlock + 4 * j;
          isum[u][t] = _mm512_dpbusd_epi32(isum[u][t], lo, broadcast4_512(xb));
          isum[u][t] = _mm512_dpbusd_epi32(isum[u][t], hi, broadcast4_512(xb + 16));
        }
      }
    }
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u;
      const __m512 dw = load_pair_ps(d0 + b * 8, d1 + b * 8);
      const __m512 mw = load_pair_ps(n0 + b * 8, n1 + b * 8);
      for (int t = 0; t < MT; ++t) {
        const int64_t r = (m0 + t) * nb + b;
        const __m512 p = _mm512_cvtepi32_ps(isum[u][t]);
        acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[r])), acc[t]);
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[r]), acc[t]);
      }
    }
  });
  store_pair<MT>(acc, out, m0, g);
}

// 8-bit groups g and g + 1 (q8_groups' layout and arithmetic). vpdpbusd multiplies unsigned by
// signed bytes, and AVX-512 has no byte sign operation to move the weight's sign onto the
// activation (q8_groups' trick). So the activations come offset by 128 (a.offset: x + 128 as
// unsigned bytes) and are multiplied with the signed weights as they are; the offset's
// contribution, 128 * (sum of the block's weights), is taken once per weight vector for all the
// tile's rows and subtracted, exactly, in integers.
template <int MT>
void q8_pair(const int8_t* wq, const float* wd, const Activations& a, int64_t K, int64_t m0, int64_t g,
             const Output& out) {
  const int64_t nb = K / kBlock;
  const int8_t* w0 = wq + g * nb * 256;
  const int8_t* w1 = w0 + nb * 256;
  const float* d0 = wd + g * nb * 8;
  const float* d1 = d0 + nb * 8;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm512_setzero_ps();
  over_blocks<kUnroll<MT>>(nb, [&](auto unroll, int64_t b0) {
    constexpr int U = decltype(unroll)::value;
    __m512i isum[U][MT];
    __m512i correction[U];
    for (int u = 0; u < U; ++u) {
      correction[u] = _mm512_setzero_si512();
      for (int t = 0; t < MT; ++t) isum[u][t] = _mm512_setzero_si512();
    }
    for (int j = 0; j < 8; ++j) {
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u;
        const __m512i w = load_pair(w0 + b * 256 + 32 * j, w1 + b * 256 + 32 * j);
        correction[u] = _mm512_dpbusd_epi32(correction[u], offset, w);
        for (int t = 0; t < MT; ++t) {
          const __m512i x = broadcast4_512(reinterpret_cast<const int8_t*>(a.offset) + (m0 + t) * K + b * kBlock + 4 * j);
          isum[u][t] = _mm512_dpbusd_epi32(isum[u][t], x, w);
        }
      }
    }
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u;
      const __m512 dw = load_pair_ps(d0 + b * 8, d1 + b * 8);
      for (int t = 0; t < MT; ++t) {
        const __m512 p = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[u][t], correction[u]));
        acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[(m0 + t) * nb + b])), acc[t]);
      }
    }
  });
  store_pair<MT>(acc, out, m0, g);
}

}  // namespace block_tiles
#endif
