// Paged attention for bf16 pools on CPUs with AVX512-BF16 (see paged_attention.cpp for
// the pool layout).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512BF16__)
// bf16 pools on CPUs with AVX512-BF16: q.k and p.v as vdpbf16ps over pairs (head-dim pairs
// for scores, token pairs for values), accumulating in fp32. Probabilities are rounded to
// bf16 for the value sum (relative error 2^-9, below the bf16 model's own noise).
template <int DIM, int GMAX>
void attention_kernel_bf16dp(const at::BFloat16* q, const uint16_t* k_pool, const uint16_t* v_pool,
                             const int64_t* tables, const int64_t* seqs, const int64_t* lens, at::BFloat16* out,
                             int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t max_blocks, float scale) {
  constexpr int BS = 16, C = DIM / 16, DP = DIM / 2;
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    uint32_t qw[GMAX][DP];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[b];
      __m512 acc[GMAX][C];
      float m[GMAX], l[GMAX];
      for (int g = 0; g < GMAX; ++g) {
        std::memcpy(qw[g], q + (b * Hq + h * GMAX + g) * DIM, DIM * 2);  // (q[2i], q[2i+1]) = word i
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.f;
      }
      const int64_t n_blocks = (ctx + BS - 1) / BS;
      for (int64_t j = 0; j < n_blocks; ++j) {
        const int64_t block = tables[seqs[b] * max_blocks + j];
        const int n_tok = static_cast<int>(std::min<int64_t>(BS, ctx - j * BS));
        const __mmask16 valid = static_cast<__mmask16>((1u << n_tok) - 1u);
        const uint16_t* kb = k_pool + (h * NB + block) * DIM * BS;   // [DP][BS][2]
        const uint16_t* vb = v_pool + (h * NB + block) * BS * DIM;   // [BS/2][DIM][2]
        __m512 s[GMAX];
        for (int g = 0; g < GMAX; ++g) s[g] = _mm512_setzero_ps();
        for (int i = 0; i < DP; ++i) {
          const __m512i kv = _mm512_loadu_si512(kb + i * BS * 2);
          for (int g = 0; g < GMAX; ++g)
            s[g] = _mm512_dpbf16_ps(s[g], (__m512bh)kv, (__m512bh)_mm512_set1_epi32(static_cast<int>(qw[g][i])));
        }
        uint32_t pw[GMAX][BS / 2];
        for (int g = 0; g < GMAX; ++g) {
          const __m512 sc = _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid,
                                               _mm512_mul_ps(s[g], _mm512_set1_ps(scale)));
          const float block_max = std::max(m[g], _mm512_reduce_max_ps(sc));
          v16f shifted;
          const __m512 diff = _mm512_sub_ps(sc, _mm512_set1_ps(block_max));
          std::memcpy(&shifted, &diff, 64);
          v16f e = exp16(shifted);
          __m512 p;
          std::memcpy(&p, &e, 64);
          p = _mm512_maskz_mov_ps(valid, p);
          const float correction = std::exp(m[g] - block_max);
          l[g] = l[g] * correction + _mm512_reduce_add_ps(p);
          m[g] = block_max;
          if (correction != 1.f) {
            const __m512 cv = _mm512_set1_ps(correction);
            for (int c = 0; c < C; ++c) acc[g][c] = _mm512_mul_ps(acc[g][c], cv);
          }
          const __m256bh pb = _mm512_cvtneps_pbh(p);
          std::memcpy(pw[g], &pb, 32);                                   // (p[2t], p[2t+1]) = word t
        }
        const int n_pairs = (n_tok + 1) / 2;
        for (int t = 0; t < n_pairs; ++t) {
          const uint16_t* vp = vb + t * DIM * 2;
          for (int c = 0; c < C; ++c) {
            const __m512i vv = _mm512_loadu_si512(vp + c * 32);
            for (int g = 0; g < GMAX; ++g)
              acc[g][c] = _mm512_dpbf16_ps(acc[g][c], (__m512bh)vv,
                                           (__m512bh)_mm512_set1_epi32(static_cast<int>(pw[g][t])));
          }
        }
      }
      for (int g = 0; g < GMAX; ++g) {
        at::BFloat16* orow = out + (b * Hq + h * GMAX + g) * DIM;
        const __m512 inv = _mm512_set1_ps(l[g] > 0.f ? 1.f / l[g] : 0.f);
        for (int c = 0; c < C; ++c) {
          const __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[g][c], inv));
          std::memcpy(orow + c * 16, &o, 32);
        }
      }
    }
  });
}
#endif

}  // namespace
