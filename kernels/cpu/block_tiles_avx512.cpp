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

// acc += w (unsigned bytes) x the 4 signed bytes at p, repeated in every lane. The 4 bytes are
// the instruction's own broadcast memory operand ({1to16}): compilers emit a separate
// vpbroadcastd for _mm512_set1_epi32, an extra vector op per multiply-add.
inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t* p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
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
    for (int u = 0; u < U; ++u) {   // the next pair's blocks, requested while this pair's are multiplied
      const int64_t b = b0 + u;
      __builtin_prefetch(w0 + 2 * nb * 128 + b * 128, 0, 1);
      __builtin_prefetch(w0 + 2 * nb * 128 + b * 128 + 64, 0, 1);
      __builtin_prefetch(w1 + 2 * nb * 128 + b * 128, 0, 1);
      __builtin_prefetch(w1 + 2 * nb * 128 + b * 128 + 64, 0, 1);
      __builtin_prefetch(d0 + 2 * nb * 8 + b * 8, 0, 1);
      __builtin_prefetch(d1 + 2 * nb * 8 + b * 8, 0, 1);
      __builtin_prefetch(n0 + 2 * nb * 8 + b * 8, 0, 1);
      __builtin_prefetch(n1 + 2 * nb * 8 + b * 8, 0, 1);
    }
    for (int j = 0; j < 4; ++j) {
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u;
        const __m512i raw = load_pair(w0 + b * 128 + 32 * j, w1 + b * 128 + 32 * j);
        const __m512i lo = _mm512_and_si512(raw, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        for (int t = 0; t < MT; ++t) {
          const int8_t* xb = a.q + (m0 + t) * K + b * kBlock + 4 * j;
          isum[u][t] = dpbusd_broadcast(isum[u][t], lo, xb);
          isum[u][t] = dpbusd_broadcast(isum[u][t], hi, xb + 16);
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
// activation (q8_groups' trick). So the weights are offset instead: w ^ 0x80 is w + 128 as an
// unsigned byte, one operation per weight vector for all the tile's rows, and the activations
// stay signed, the instruction's broadcast memory operand. The offset adds 128 * (the block's
// sum of activations) to each row's sum: a.sums128, taken once per row and block, is subtracted
// exactly, in integers.
//
// kStreamed: the weight is larger than the caches (a 49,152-row output head), so each block of
// the next pair is requested while this pair's is multiplied; the first row tile over a chunk
// then no longer waits on memory (head at 8 rows, AMD EPYC Zen 4: 3.1 -> 2.4 ms). For weights
// that stay in cache the requests only cost issue slots.
template <int MT, bool kStreamed>
void q8_pair(const int8_t* wq, const float* wd, const Activations& a, int64_t K, int64_t m0, int64_t g,
             const Output& out) {
  const int64_t nb = K / kBlock;
  const int8_t* w0 = wq + g * nb * 256;
  const int8_t* w1 = w0 + nb * 256;
  const float* d0 = wd + g * nb * 8;
  const float* d1 = d0 + nb * 8;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm512_setzero_ps();
  over_blocks<kUnroll<MT>>(nb, [&](auto unroll, int64_t b0) {
    constexpr int U = decltype(unroll)::value;
    __m512i isum[U][MT];
    for (int u = 0; u < U; ++u)
      for (int t = 0; t < MT; ++t) isum[u][t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u;
        if (kStreamed && j < 4) {
          __builtin_prefetch(w0 + 2 * nb * 256 + b * 256 + 64 * j, 0, 1);
          __builtin_prefetch(w1 + 2 * nb * 256 + b * 256 + 64 * j, 0, 1);
        }
        const __m512i w = _mm512_xor_si512(load_pair(w0 + b * 256 + 32 * j, w1 + b * 256 + 32 * j), flip);
        for (int t = 0; t < MT; ++t)
          isum[u][t] = dpbusd_broadcast(isum[u][t], w, a.q + (m0 + t) * K + b * kBlock + 4 * j);
      }
    }
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u;
      const __m512 dw = load_pair_ps(d0 + b * 8, d1 + b * 8);
      for (int t = 0; t < MT; ++t) {
        const int64_t r = (m0 + t) * nb + b;
        const __m512 p = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[u][t], _mm512_set1_epi32(a.sums128[r])));
        acc[t] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[r])), acc[t]);
      }
    }
  });
  store_pair<MT>(acc, out, m0, g);
}

}  // namespace block_tiles
#endif
