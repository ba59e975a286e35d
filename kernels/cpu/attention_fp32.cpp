// Paged attention kernels that compute in fp32 lanes: the general one (any head size,
// block size and pair packing) and the 16-lane one for unpacked pools with 16-token blocks
// (fp32, int8, fp8 and int4 storage), where a block's scores for one query head are one vector.
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

// A multiply-add's result is ready ~4 cycles after it issues, so a loop whose sums each form one
// chain of dependent multiply-adds waits on that latency unless several chains are in flight.
// More chains need more registers: AVX-512 has 32 vector registers (one per v16f); AVX2 16,
// two per v16f. These counts of v16f values leave room for the loads and broadcasts.
#if defined(__AVX512F__)
constexpr int kVectorBudget = 24;
#else
constexpr int kVectorBudget = 6;
#endif

// Value-sum chunks (16 head dims each) taken in one pass over a block's tokens: each chunk's
// GMAX sums are separate chains, and each sum still adds its tokens in order (the same bits as
// one chunk at a time).
template <int DIM, int GMAX>
constexpr int chunks_per_pass() {
  int cp = 1;
  while (cp * 2 <= DIM / 16 && cp * 2 * (GMAX + 1) <= kVectorBudget) cp *= 2;
  return cp;
}

// Whether two blocks' scores are summed in one pass (2 * GMAX chains), where registers allow.
template <int GMAX>
constexpr bool kTwoBlockScores = 2 * GMAX + 2 <= kVectorBudget;

// How a 16-token block is stored, per pool type: K scores and value sums over one block.
// ST = float or int8_t: one element per value (K block [DIM][BS], V block [BS][DIM]);
// Fp8E4M3: the same, each element read as value * 2^-8 (kUnit folds the 2^8 into the scales).
template <typename ST, int DIM, int GMAX>
struct BlockOps {
  static constexpr int64_t kBlockElems = DIM * 16, kRowElems = DIM;
  static constexpr float kUnit = std::is_same_v<ST, Fp8E4M3> ? kFp8Unit : 1.f;
  static constexpr bool kZero = false;
  // s[g][t] += sum_d q[g][d] k[t][d] over the block's 16 tokens.
  static inline void scores(const ST* kt, const float (*qf)[DIM], v16f* s) {
    for (int d = 0; d < DIM; ++d) {
      const v16f kd = load16(kt + d * 16);
      for (int g = 0; g < GMAX; ++g) s[g] += qf[g][d] * kd;
    }
  }
  // scores() of two blocks at once: each block's sums in the same order as alone.
  static inline void scores2(const ST* k0, const ST* k1, const float (*qf)[DIM], v16f* s0, v16f* s1) {
    for (int d = 0; d < DIM; ++d) {
      const v16f a = load16(k0 + d * 16), b = load16(k1 + d * 16);
      for (int g = 0; g < GMAX; ++g) {
        s0[g] += qf[g][d] * a;
        s1[g] += qf[g][d] * b;
      }
    }
  }
  // acc[g] += sum_t p[g][t] * v[t] over the block's first n_tok value rows, CP 16-dim chunks
  // per pass over the tokens: CP * GMAX accumulators stay in registers (all DIM / 16 chunks of
  // GMAX heads would not fit where a vector is two AVX2 registers).
  static inline void add_block(const ST* vb, const float (*p)[16], int n_tok, v16f (*acc)[DIM / 16]) {
    constexpr int CP = chunks_per_pass<DIM, GMAX>();
    for (int c0 = 0; c0 < DIM / 16; c0 += CP) {
      v16f a[GMAX][CP];
      for (int g = 0; g < GMAX; ++g)
        for (int c = 0; c < CP; ++c) a[g][c] = acc[g][c0 + c];
      for (int t = 0; t < n_tok; ++t) {
        for (int c = 0; c < CP; ++c) {
          const v16f vv = load16(vb + t * kRowElems + (c0 + c) * 16);
          for (int g = 0; g < GMAX; ++g) a[g][c] += p[g][t] * vv;
        }
      }
      for (int g = 0; g < GMAX; ++g)
        for (int c = 0; c < CP; ++c) acc[g][c0 + c] = a[g][c];
    }
  }
};

// INT4 pools: K block [DIM/2][BS] and V block [BS][DIM/2] bytes, each byte holding head dims
// j and j + DIM/2; values are q * scale + zero, the zero handled per token by the caller.
template <int DIM, int GMAX>
struct BlockOps<Int4Pair, DIM, GMAX> {
  static constexpr int64_t kBlockElems = DIM / 2 * 16, kRowElems = DIM / 2;
  static constexpr float kUnit = 1.f;
  static constexpr bool kZero = true;
  static_assert(DIM % 32 == 0, "int4 pools need a head size that is a multiple of 32");
  static inline void scores(const Int4Pair* kt, const float (*qf)[DIM], v16f* s) {
    for (int i = 0; i < DIM / 2; ++i) {
      v16f lo, hi;
      load16_nibbles(kt + i * 16, lo, hi);
      for (int g = 0; g < GMAX; ++g) s[g] += qf[g][i] * lo + qf[g][i + DIM / 2] * hi;
    }
  }
  static inline void scores2(const Int4Pair* k0, const Int4Pair* k1, const float (*qf)[DIM], v16f* s0, v16f* s1) {
    scores(k0, qf, s0);
    scores(k1, qf, s1);
  }
  static inline void add_block(const Int4Pair* vb, const float (*p)[16], int n_tok, v16f (*acc)[DIM / 16]) {
    constexpr int H = DIM / 32;   // 16-lane chunks per half of the head
    for (int c = 0; c < H; ++c) {
      v16f a_lo[GMAX], a_hi[GMAX];
      for (int g = 0; g < GMAX; ++g) {
        a_lo[g] = acc[g][c];
        a_hi[g] = acc[g][c + H];
      }
      for (int t = 0; t < n_tok; ++t) {
        v16f lo, hi;
        load16_nibbles(vb + t * kRowElems + c * 16, lo, hi);
        for (int g = 0; g < GMAX; ++g) {
          a_lo[g] += p[g][t] * lo;
          a_hi[g] += p[g][t] * hi;
        }
      }
      for (int g = 0; g < GMAX; ++g) {
        acc[g][c] = a_lo[g];
        acc[g][c + H] = a_hi[g];
      }
    }
  }
};

// A sequence's blocks lie anywhere in the pool, so the hardware prefetcher, which follows
// addresses within a page, starts cold at every block: a decode step's K loads waited on memory.
// The next block's K and V are requested while this one is computed.
// Requested 4 blocks ahead, into L2: one block ahead (or into L1) left most of the wait
// (decode step at batch 16, ~450-token contexts, AMD EPYC Zen 4: 42.9 ms without prefetch, 39.7
// one ahead, 38.3 four ahead, 39.6 eight ahead).
constexpr int64_t kBlocksAhead = 4;

template <typename Ops, typename ST>
inline void prefetch_block(const ST* k_pool, const ST* v_pool, int64_t base) {
  constexpr int64_t kBytes = Ops::kBlockElems * static_cast<int64_t>(sizeof(ST));
  const char* k = reinterpret_cast<const char*>(k_pool + base * Ops::kBlockElems);
  const char* v = reinterpret_cast<const char*>(v_pool + base * Ops::kBlockElems);
  for (int64_t off = 0; off < kBytes; off += 64) {
    __builtin_prefetch(k + off, 0, 1);
    __builtin_prefetch(v + off, 0, 1);
  }
}

// The 16-lane kernel for unpacked 16-token blocks: fp32 pools (no scales) and quantized pools
// with one fp16 scale per (KV head, token) for K and for V ([Hkv, NB, BS]; for INT4
// [Hkv, NB, 2, BS]: scales, then zeros). A token's K scale multiplies its score and its V
// scale its probability: dequantization costs one multiply per token, not per element. With a
// zero point z, q.k = scale * q.kq + z * sum(q), and the values gain z * sum_t p_t.
template <typename QT, typename ST, int DIM, int GMAX>
void attention_kernel_v16(const QT* q, const ST* k_pool, const ST* v_pool, const at::Half* k_scale,
                          const at::Half* v_scale, const int64_t* tables, const int64_t* seqs, const int64_t* lens,
                          QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t max_blocks, float scale) {
  using Ops = BlockOps<ST, DIM, GMAX>;
  constexpr int BS = 16;
  constexpr int C = DIM / 16;   // 16-lane chunks per head row
  constexpr int SCALE_ROWS = Ops::kZero ? 2 : 1;
  static_assert(DIM % 16 == 0, "head size must be a multiple of 16");
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float qf[GMAX][DIM];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[b];
      if (item + 1 < end) {   // the next item's first blocks, which its own look-ahead cannot reach
        const int64_t nb = (item + 1) / Hkv, nh = (item + 1) % Hkv;
        const int64_t first = std::min<int64_t>(kBlocksAhead, (lens[nb] + BS - 1) / BS);
        for (int64_t j = 0; j < first; ++j)
          prefetch_block<Ops, ST>(k_pool, v_pool, nh * NB + tables[seqs[nb] * max_blocks + j]);
      }
      v16f acc[GMAX][C];
      float m[GMAX], l[GMAX], qsum[GMAX];
      for (int g = 0; g < GMAX; ++g) {
        const QT* qrow = q + (b * Hq + h * GMAX + g) * DIM;
        qsum[g] = 0.f;
        for (int d = 0; d < DIM; ++d) {
          qf[g][d] = static_cast<float>(qrow[d]) * scale;
          qsum[g] += qf[g][d];
        }
        for (int c = 0; c < C; ++c) acc[g][c] = v16f{};
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.f;
      }
      const int64_t n_blocks = (ctx + BS - 1) / BS;
      const int64_t* table = tables + seqs[b] * max_blocks;
      constexpr bool kPairs = kTwoBlockScores<GMAX>;
      v16f next_scores[GMAX];   // block j + 1's scores, summed beside block j's
      bool have_next = false;
      for (int64_t j = 0; j < n_blocks; ++j) {
        const int n_tok = static_cast<int>(std::min<int64_t>(BS, ctx - j * BS));
        const int64_t base = h * NB + table[j];
        const ST* kt = k_pool + base * Ops::kBlockElems;
        const ST* vb = v_pool + base * Ops::kBlockElems;
        if (j + kBlocksAhead < n_blocks) prefetch_block<Ops, ST>(k_pool, v_pool, h * NB + table[j + kBlocksAhead]);
        v16f s[GMAX];
        if (have_next) {
          for (int g = 0; g < GMAX; ++g) s[g] = next_scores[g];
          have_next = false;
        } else {
          for (int g = 0; g < GMAX; ++g) s[g] = v16f{};
          if (kPairs && j + 1 < n_blocks) {
            for (int g = 0; g < GMAX; ++g) next_scores[g] = v16f{};
            Ops::scores2(kt, k_pool + (h * NB + table[j + 1]) * Ops::kBlockElems, qf, s, next_scores);
            have_next = true;
          } else {
            Ops::scores(kt, qf, s);
          }
        }
        alignas(64) float ks[BS], vs[BS], kz[BS], vz[BS];
        if (k_scale != nullptr) {
          const at::Half* ksb = k_scale + base * SCALE_ROWS * BS;
          const at::Half* vsb = v_scale + base * SCALE_ROWS * BS;
          for (int t = 0; t < BS; ++t) {
            ks[t] = static_cast<float>(ksb[t]) * Ops::kUnit;
            vs[t] = static_cast<float>(vsb[t]) * Ops::kUnit;
          }
          const v16f kscale = load16(ks);
          for (int g = 0; g < GMAX; ++g) s[g] *= kscale;
          if constexpr (Ops::kZero) {
            for (int t = 0; t < BS; ++t) {
              kz[t] = static_cast<float>(ksb[BS + t]);
              vz[t] = static_cast<float>(vsb[BS + t]);
            }
            const v16f kzero = load16(kz);
            for (int g = 0; g < GMAX; ++g) s[g] += qsum[g] * kzero;
          }
        }
        alignas(64) float p[GMAX][BS];
        float zsum[GMAX];
        for (int g = 0; g < GMAX; ++g) {
          alignas(64) float sc[BS];
          std::memcpy(sc, &s[g], 64);
          float block_max = m[g];
          for (int t = 0; t < n_tok; ++t) block_max = std::max(block_max, sc[t]);
          for (int t = n_tok; t < BS; ++t) sc[t] = -std::numeric_limits<float>::infinity();
          std::memcpy(&s[g], sc, 64);
          const v16f e = exp16(s[g] - block_max);
          std::memcpy(p[g], &e, 64);
          for (int t = n_tok; t < BS; ++t) p[g][t] = 0.f;
          float sum = 0.f;
          for (int t = 0; t < BS; ++t) sum += p[g][t];
          const float correction = std::exp(m[g] - block_max);
          m[g] = block_max;
          l[g] = l[g] * correction + sum;
          for (int c = 0; c < C; ++c) acc[g][c] *= correction;
          zsum[g] = 0.f;
          if (v_scale != nullptr) {
            if constexpr (Ops::kZero)
              for (int t = 0; t < n_tok; ++t) zsum[g] += p[g][t] * vz[t];
            for (int t = 0; t < BS; ++t) p[g][t] *= vs[t];
          }
        }
        Ops::add_block(vb, p, n_tok, acc);
        if constexpr (Ops::kZero)
          for (int g = 0; g < GMAX; ++g)
            for (int c = 0; c < C; ++c) acc[g][c] += zsum[g];
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
