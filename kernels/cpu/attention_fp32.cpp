// Paged attention kernels that compute in fp32 lanes: the general one (any head size,
// block size and pair packing) and the 16-lane one for unpacked pools with 16-token blocks,
// where a block's scores for one query head are one vector.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// ST: storage type of the pool (float or the bits of a bf16); QT: query/output type.
template <typename QT, typename ST>
void attention_kernel(const QT* q, const ST* k_pool, const ST* v_pool, const int64_t* tables, const int64_t* seqs,
                      const int64_t* lens, QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t BS,
                      int64_t D, int64_t max_blocks, float scale, int64_t P) {
  const int64_t G = Hq / Hkv;
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), kd(BS), vrow(D), s(G * BS), m(G), l(G);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[b];
      for (int64_t g = 0; g < G; ++g) {
        const QT* qrow = q + (b * Hq + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qrow[d]) * scale;
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t n_blocks = (ctx + BS - 1) / BS;
      for (int64_t j = 0; j < n_blocks; ++j) {
        const int64_t block = tables[seqs[b] * max_blocks + j];
        const int64_t n_tok = std::min(BS, ctx - j * BS);
        const ST* kt = k_pool + (h * NB + block) * D * BS;   // [D, BS]
        const ST* vb = v_pool + (h * NB + block) * BS * D;   // [BS, D]
        std::fill(s.begin(), s.end(), 0.f);
        for (int64_t d = 0; d < D; ++d) {
          const ST* row = kt + (d / P) * BS * P + d % P;
          for (int64_t t = 0; t < BS; ++t) kd[t] = to_f32(row[t * P]);
          for (int64_t g = 0; g < G; ++g) {
            const float qd = qf[g * D + d];
            float* sg = s.data() + g * BS;
#pragma omp simd
            for (int64_t t = 0; t < BS; ++t) sg[t] += qd * kd[t];
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          float* sg = s.data() + g * BS;
          float block_max = m[g];
          for (int64_t t = 0; t < n_tok; ++t) block_max = std::max(block_max, sg[t]);
          const float correction = std::exp(m[g] - block_max);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < BS; ++t) {
            const float p = t < n_tok ? std::exp(sg[t] - block_max) : 0.f;
            sg[t] = p;
            sum += p;
          }
          m[g] = block_max;
          l[g] = l[g] * correction + sum;
          float* a = acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] *= correction;
        }
        for (int64_t t = 0; t < n_tok; ++t) {
          const ST* vr = vb + (t / P) * D * P + t % P;
          for (int64_t d = 0; d < D; ++d) vrow[d] = to_f32(vr[d * P]);
          for (int64_t g = 0; g < G; ++g) {
            const float p = s[g * BS + t];
            float* a = acc.data() + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * vrow[d];
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        QT* orow = out + (b * Hq + h * G + g) * D;
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        for (int64_t d = 0; d < D; ++d) store_out(orow, d, acc[g * D + d] * inv);
      }
    }
  });
}

template <typename QT, typename ST, int DIM, int GMAX>
void attention_kernel_v16(const QT* q, const ST* k_pool, const ST* v_pool, const at::Half* k_scale,
                          const at::Half* v_scale, const int64_t* tables, const int64_t* seqs, const int64_t* lens,
                          QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t max_blocks, float scale) {
  constexpr int BS = 16;
  constexpr int C = DIM / 16;   // 16-lane chunks per head row
  static_assert(DIM % 16 == 0, "head size must be a multiple of 16");
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float qf[GMAX][DIM];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[b];
      v16f acc[GMAX][C];
      float m[GMAX], l[GMAX];
      for (int g = 0; g < GMAX; ++g) {
        const QT* qrow = q + (b * Hq + h * GMAX + g) * DIM;
        for (int d = 0; d < DIM; ++d) qf[g][d] = static_cast<float>(qrow[d]) * scale;
        for (int c = 0; c < C; ++c) acc[g][c] = v16f{};
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.f;
      }
      const int64_t n_blocks = (ctx + BS - 1) / BS;
      for (int64_t j = 0; j < n_blocks; ++j) {
        const int64_t block = tables[seqs[b] * max_blocks + j];
        const int n_tok = static_cast<int>(std::min<int64_t>(BS, ctx - j * BS));
        const int64_t base = h * NB + block;
        const ST* kt = k_pool + base * DIM * BS;
        const ST* vb = v_pool + base * BS * DIM;
        v16f s[GMAX];
        for (int g = 0; g < GMAX; ++g) s[g] = v16f{};
        for (int d = 0; d < DIM; ++d) {
          const v16f kd = load16(kt + d * BS);
          for (int g = 0; g < GMAX; ++g) s[g] += qf[g][d] * kd;
        }
        // Quantized pools: a token's K scale multiplies its score, its V scale its probability.
        alignas(64) float ks[BS], vs[BS];
        if (k_scale != nullptr) {
          for (int t = 0; t < BS; ++t) {
            ks[t] = static_cast<float>(k_scale[base * BS + t]);
            vs[t] = static_cast<float>(v_scale[base * BS + t]);
          }
          const v16f kscale = load16(ks);
          for (int g = 0; g < GMAX; ++g) s[g] *= kscale;
        }
        alignas(64) float p[GMAX][BS];
        for (int g = 0; g < GMAX; ++g) {
          alignas(64) float sc[BS];
          std::memcpy(sc, &s[g], 64);
          float block_max = m[g];
          for (int t = 0; t < n_tok; ++t) block_max = std::max(block_max, sc[t]);
          for (int t = n_tok; t < BS; ++t) sc[t] = -std::numeric_limits<float>::infinity();
          std::memcpy(&s[g], sc, 64);
          v16f e = exp16(s[g] - block_max);
          e = s[g] == -std::numeric_limits<float>::infinity() ? v16f{} : e;
          std::memcpy(p[g], &e, 64);
          float sum = 0.f;
          for (int t = 0; t < BS; ++t) sum += p[g][t];
          const float correction = std::exp(m[g] - block_max);
          m[g] = block_max;
          l[g] = l[g] * correction + sum;
          for (int c = 0; c < C; ++c) acc[g][c] *= correction;
          if (v_scale != nullptr)
            for (int t = 0; t < BS; ++t) p[g][t] *= vs[t];
        }
        for (int t = 0; t < n_tok; ++t) {
          const ST* vr = vb + t * DIM;
          for (int c = 0; c < C; ++c) {
            const v16f vv = load16(vr + c * 16);
            for (int g = 0; g < GMAX; ++g) acc[g][c] += p[g][t] * vv;
          }
        }
      }
      for (int g = 0; g < GMAX; ++g) {
        QT* orow = out + (b * Hq + h * GMAX + g) * DIM;
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        alignas(64) float row[DIM];
        std::memcpy(row, acc[g], sizeof(row));
        for (int d = 0; d < DIM; ++d) store_out(orow, d, row[d] * inv);
      }
    }
  });
}

}  // namespace
