// Paged KV cache kernels for CPUs: writing new K/V into the pool, and decode attention.
//
// Pool layout (one layer), with P = 2 for 16-bit pools and 1 for fp32:
//   K [kv_heads, blocks, head_dim / P, block_size, P]: each block transposed, so one query's
//     scores over a block's tokens are lane-wise FMAs with no horizontal sums; pairs of
//     adjacent head dims sit together for AVX512-BF16 dot products (vdpbf16ps).
//   V [kv_heads, blocks, block_size / P, head_dim, P]: pairs of adjacent tokens together,
//     so the weighted sum of values is a bf16 dot product over token pairs too.
//
// Attention: every query token of a step (a decode token, or a token of a prefill chunk)
// attends over the first `context_len` positions of its sequence, read in place through
// the sequence's block table (no gathered copy); causality is just that context length.
// Work is split over (token, KV head) pairs; the query heads sharing a KV head
// (grouped-query attention) are processed together so each K/V element is loaded once.
// Softmax is online, one block at a time, in fp32.
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

inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t bf16_bits) {
  const uint32_t wide = static_cast<uint32_t>(bf16_bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

inline void store_out(float* p, int64_t i, float v) { p[i] = v; }
inline void store_out(at::BFloat16* p, int64_t i, float v) { p[i] = at::BFloat16(v); }

// ST: storage type of the pool (float or the bits of a bf16); QT: query/output type.
// DIM and BSZ are compile-time head and block sizes when known (0 = runtime).
template <typename QT, typename ST, int DIM, int BSZ>
void attention_kernel(const QT* q, const ST* k_pool, const ST* v_pool, const int64_t* tables, const int64_t* seqs,
                   const int64_t* lens, QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t bs_rt,
                   int64_t d_rt, int64_t max_blocks, float scale, int64_t P) {
  const int64_t D = DIM > 0 ? DIM : d_rt;
  const int64_t BS = BSZ > 0 ? BSZ : bs_rt;
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

// The hot case, bf16 or fp32 pool with 16-token blocks: a block's scores for one query
// head are one 16-lane vector (GCC/Clang vector extensions; AVX-512 with -march=native).
typedef float v16f __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f r;
  std::memcpy(&r, p, 64);
  return r;
}
inline v16f load16(const uint16_t* p) {
  typedef uint16_t v16h __attribute__((vector_size(32)));
  typedef uint32_t v16u __attribute__((vector_size(64)));
  v16h h;
  std::memcpy(&h, p, 32);
  v16u w = __builtin_convertvector(h, v16u) << 16;
  v16f r;
  std::memcpy(&r, &w, 64);
  return r;
}

// exp on 16 lanes: 2^(x log2 e) split into 2^n * 2^f, with a degree-6 polynomial for
// 2^f on [-0.5, 0.5] (relative error ~2e-7, below bf16 and fp32 softmax noise).
inline v16f exp16(v16f x) {
  typedef int32_t v16i __attribute__((vector_size(64)));
  const v16f lo = v16f{} - 87.0f, hi = v16f{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v16f t = x * 1.44269504088896341f;
  const v16f n = __builtin_convertvector(__builtin_convertvector(t + (t < 0 ? -0.5f : 0.5f), v16i), v16f);
  const v16f f = t - n;
  v16f poly = v16f{} + 1.5403530393381606e-4f;
  poly = poly * f + 1.3333558146428443e-3f;
  poly = poly * f + 9.6181291076284772e-3f;
  poly = poly * f + 5.5504108664821580e-2f;
  poly = poly * f + 2.4022650695910071e-1f;
  poly = poly * f + 6.9314718055994531e-1f;
  poly = poly * f + 1.0f;
  v16i bits;
  std::memcpy(&bits, &poly, 64);
  bits += __builtin_convertvector(n, v16i) << 23;
  v16f r;
  std::memcpy(&r, &bits, 64);
  return r;
}

template <typename QT, typename ST, int DIM, int GMAX>
void attention_kernel_v16(const QT* q, const ST* k_pool, const ST* v_pool, const int64_t* tables, const int64_t* seqs,
                       const int64_t* lens, QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB,
                       int64_t max_blocks, float scale) {
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
        const ST* kt = k_pool + (h * NB + block) * DIM * BS;
        const ST* vb = v_pool + (h * NB + block) * BS * DIM;
        v16f s[GMAX];
        for (int g = 0; g < GMAX; ++g) s[g] = v16f{};
        for (int d = 0; d < DIM; ++d) {
          const v16f kd = load16(kt + d * BS);
          for (int g = 0; g < GMAX; ++g) s[g] += qf[g][d] * kd;
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

template <typename QT, typename ST>
void attention_dispatch(const QT* q, const ST* k, const ST* v, const int64_t* tables, const int64_t* seqs,
                     const int64_t* lens, QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t BS, int64_t D,
                     int64_t max_blocks, float scale, int64_t P) {
  const int64_t G = Hq / Hkv;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<QT, at::BFloat16>) {
#define TG_DP(DIM_, G_)                                                                                        \
    if (P == 2 && D == DIM_ && BS == 16 && G == G_) {                                                          \
      attention_kernel_bf16dp<DIM_, G_>(q, k, v, tables, seqs, lens, out, B, Hq, Hkv, NB, max_blocks, scale);  \
      return;                                                                                                  \
    }
    TG_DP(64, 1) TG_DP(64, 2) TG_DP(64, 3) TG_DP(64, 4) TG_DP(64, 8)
    TG_DP(128, 1) TG_DP(128, 2) TG_DP(128, 4) TG_DP(128, 8)
#undef TG_DP
  }
#endif
#define TG_V16(DIM_, G_)                                                                              \
  if (P == 1 && D == DIM_ && BS == 16 && G == G_) {                                                  \
    attention_kernel_v16<QT, ST, DIM_, G_>(q, k, v, tables, seqs, lens, out, B, Hq, Hkv, NB, max_blocks, scale); \
    return;                                                                                           \
  }
  TG_V16(64, 1) TG_V16(64, 2) TG_V16(64, 3) TG_V16(64, 4) TG_V16(64, 8)
  TG_V16(128, 1) TG_V16(128, 2) TG_V16(128, 4) TG_V16(128, 8)
#undef TG_V16
  attention_kernel<QT, ST, 0, 0>(q, k, v, tables, seqs, lens, out, B, Hq, Hkv, NB, BS, D, max_blocks, scale, P);
}

template <typename ST>
void write_kernel(const ST* k, const ST* v, ST* k_pool, ST* v_pool, const int64_t* slots, int64_t T, int64_t Hkv,
                  int64_t NB, int64_t BS, int64_t D, int64_t P) {
  at::parallel_for(0, T * Hkv, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hkv, h = item % Hkv;
      const int64_t block = slots[t] / BS, off = slots[t] % BS;
      const ST* ks = k + (t * Hkv + h) * D;
      const ST* vs = v + (t * Hkv + h) * D;
      ST* kb = k_pool + (h * NB + block) * D * BS;
      ST* vb = v_pool + (h * NB + block) * BS * D;
      for (int64_t d = 0; d < D; ++d) kb[((d / P) * BS + off) * P + d % P] = ks[d];
      ST* vd = vb + (off / P) * D * P + off % P;
      for (int64_t d = 0; d < D; ++d) vd[d * P] = vs[d];
    }
  });
}

struct PoolShape {
  int64_t Hkv, NB, D, BS, P;
};

PoolShape check_pool(const torch::Tensor& k_pool, const torch::Tensor& v_pool) {
  TORCH_CHECK(k_pool.dim() == 5 && v_pool.dim() == 5, "pools must be [Hkv, NB, D/P, BS, P] and [Hkv, NB, BS/P, D, P]");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), "KV pools must be contiguous");
  const int64_t P = k_pool.size(4);
  PoolShape shape{k_pool.size(0), k_pool.size(1), k_pool.size(2) * P, k_pool.size(3), P};
  TORCH_CHECK(v_pool.size(4) == P && v_pool.size(3) == shape.D && v_pool.size(2) * P == shape.BS &&
                  v_pool.size(0) == shape.Hkv && v_pool.size(1) == shape.NB,
              "K and V pools disagree");
  return shape;
}

}  // namespace

// q: [T, Hq, D]; k_pool: [Hkv, NB, D, BS]; v_pool: [Hkv, NB, BS, D] (one layer);
// block_tables: [S, max_blocks] int64; seq_of_token: [T] int64 (row of block_tables);
// context_lens: [T] int64 (positions each token attends over, itself included).
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                              torch::Tensor block_tables, torch::Tensor seq_of_token, torch::Tensor context_lens,
                              double scale) {
  const PoolShape ps = check_pool(k_pool, v_pool);
  TORCH_CHECK(q.dim() == 3, "q must be [T, Hq, D]");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong &&
                  seq_of_token.scalar_type() == at::kLong, "int64 indices");
  TORCH_CHECK(q.scalar_type() == k_pool.scalar_type(), "q and the KV pool must share a dtype");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  seq_of_token = seq_of_token.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t Hkv = ps.Hkv, NB = ps.NB, BS = ps.BS, P = ps.P;
  TORCH_CHECK(ps.D == D && Hq % Hkv == 0, "head sizes do not match");
  TORCH_CHECK(seq_of_token.size(0) == T && context_lens.size(0) == T, "one seq index and length per token");
  auto out = torch::empty_like(q);
  const auto* tables = block_tables.data_ptr<int64_t>();
  const auto* seqs = seq_of_token.data_ptr<int64_t>();
  const auto* lens = context_lens.data_ptr<int64_t>();
  const int64_t mb = block_tables.size(1);
  if (q.scalar_type() == at::kFloat) {
    attention_dispatch<float, float>(q.data_ptr<float>(), k_pool.data_ptr<float>(), v_pool.data_ptr<float>(), tables,
                                  seqs, lens, out.data_ptr<float>(), T, Hq, Hkv, NB, BS, D, mb, scale, P);
  } else if (q.scalar_type() == at::kBFloat16) {
    attention_dispatch<at::BFloat16, uint16_t>(
        q.data_ptr<at::BFloat16>(), reinterpret_cast<const uint16_t*>(k_pool.data_ptr<at::BFloat16>()),
        reinterpret_cast<const uint16_t*>(v_pool.data_ptr<at::BFloat16>()), tables, seqs, lens,
        out.data_ptr<at::BFloat16>(), T, Hq, Hkv, NB, BS, D, mb, scale, P);
  } else {
    TORCH_CHECK(false, "paged_attention supports float32 and bfloat16");
  }
  return out;
}

// k, v: [T, Hkv, D]; slot_mapping: [T] int64 (slot = block * BS + offset). In place.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_pool, torch::Tensor v_pool,
              torch::Tensor slot_mapping) {
  const PoolShape ps = check_pool(k_pool, v_pool);
  TORCH_CHECK(k.scalar_type() == k_pool.scalar_type() && v.scalar_type() == v_pool.scalar_type(), "dtype mismatch");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "int64 slots");
  k = k.contiguous();
  v = v.contiguous();
  slot_mapping = slot_mapping.contiguous();
  const int64_t T = k.size(0), Hkv = k.size(1), D = k.size(2);
  const int64_t NB = ps.NB, BS = ps.BS, P = ps.P;
  TORCH_CHECK(Hkv == ps.Hkv && D == ps.D, "k/v do not match the pool");
  const auto* slots = slot_mapping.data_ptr<int64_t>();
  if (k.element_size() == 4) {
    write_kernel<uint32_t>(reinterpret_cast<const uint32_t*>(k.data_ptr()), reinterpret_cast<const uint32_t*>(v.data_ptr()),
                           reinterpret_cast<uint32_t*>(k_pool.data_ptr()), reinterpret_cast<uint32_t*>(v_pool.data_ptr()),
                           slots, T, Hkv, NB, BS, D, P);
  } else if (k.element_size() == 2) {
    write_kernel<uint16_t>(reinterpret_cast<const uint16_t*>(k.data_ptr()), reinterpret_cast<const uint16_t*>(v.data_ptr()),
                           reinterpret_cast<uint16_t*>(k_pool.data_ptr()), reinterpret_cast<uint16_t*>(v_pool.data_ptr()),
                           slots, T, Hkv, NB, BS, D, P);
  } else {
    TORCH_CHECK(false, "write_kv supports 2- and 4-byte elements");
  }
}
