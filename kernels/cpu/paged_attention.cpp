// Decode attention over a paged KV cache, for CPUs.
//
// One query token per sequence attends over its context, read in place from the KV pool
// through the sequence's block table (no gathered copy). Work is split over
// (sequence, KV head) pairs; the query heads that share a KV head (grouped-query
// attention) are processed together so each K/V row is loaded once. Softmax is computed
// online, one block at a time, in fp32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float load_f32(const float* p, int64_t i) { return p[i]; }

inline float load_f32(const at::BFloat16* p, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, reinterpret_cast<const char*>(p) + 2 * i, 2);
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(at::BFloat16* p, int64_t i, float v) { p[i] = at::BFloat16(v); }

// DIM is the head size when known at compile time (lets the compiler unroll and
// vectorize the row loops), or 0 for any size.
template <typename QT, typename KT, int DIM>
void decode_kernel(const QT* q, const KT* k_pool, const KT* v_pool, const int64_t* tables,
                   const int64_t* lens, QT* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t NB,
                   int64_t BS, int64_t D_runtime, int64_t max_blocks, float scale) {
  const int64_t D = DIM > 0 ? DIM : D_runtime;
  const int64_t G = Hq / Hkv;
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), kv(BS * D), scores(G * BS);
    std::vector<float> m(G), l(G);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[b];
      for (int64_t g = 0; g < G; ++g) {
        const QT* qrow = q + (b * Hq + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = load_f32(qrow, d) * scale;
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t n_blocks = (ctx + BS - 1) / BS;
      for (int64_t j = 0; j < n_blocks; ++j) {
        const int64_t block = tables[b * max_blocks + j];
        const int64_t n_tok = std::min(BS, ctx - j * BS);
        const KT* kb = k_pool + ((h * NB + block) * BS) * D;
        const KT* vb = v_pool + ((h * NB + block) * BS) * D;
        // S[g, t] = q_g . k_t for the block's tokens.
        for (int64_t i = 0; i < n_tok * D; ++i) kv[i] = load_f32(kb, i);
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qf.data() + g * D;
          for (int64_t t = 0; t < n_tok; ++t) {
            const float* kt = kv.data() + t * D;
            float s = 0.f;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; ++d) s += qg[d] * kt[d];
            scores[g * BS + t] = s;
          }
        }
        // Online softmax: rescale what was accumulated when the running max grows.
        for (int64_t g = 0; g < G; ++g) {
          float block_max = m[g];
          for (int64_t t = 0; t < n_tok; ++t) block_max = std::max(block_max, scores[g * BS + t]);
          const float correction = std::exp(m[g] - block_max);
          m[g] = block_max;
          float sum = 0.f;
          for (int64_t t = 0; t < n_tok; ++t) {
            const float p = std::exp(scores[g * BS + t] - block_max);
            scores[g * BS + t] = p;
            sum += p;
          }
          l[g] = l[g] * correction + sum;
          float* a = acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] *= correction;
        }
        // acc[g] += sum_t p[g, t] * v_t
        for (int64_t i = 0; i < n_tok * D; ++i) kv[i] = load_f32(vb, i);
        for (int64_t g = 0; g < G; ++g) {
          float* a = acc.data() + g * D;
          for (int64_t t = 0; t < n_tok; ++t) {
            const float p = scores[g * BS + t];
            const float* vt = kv.data() + t * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * vt[d];
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        QT* orow = out + (b * Hq + h * G + g) * D;
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        for (int64_t d = 0; d < D; ++d) store(orow, d, acc[g * D + d] * inv);
      }
    }
  });
}

template <typename QT, typename KT>
void decode_dispatch(const QT* q, const KT* k, const KT* v, const int64_t* tables, const int64_t* lens, QT* out,
                     int64_t B, int64_t Hq, int64_t Hkv, int64_t NB, int64_t BS, int64_t D, int64_t max_blocks,
                     float scale) {
  if (D == 64) {
    decode_kernel<QT, KT, 64>(q, k, v, tables, lens, out, B, Hq, Hkv, NB, BS, D, max_blocks, scale);
  } else if (D == 128) {
    decode_kernel<QT, KT, 128>(q, k, v, tables, lens, out, B, Hq, Hkv, NB, BS, D, max_blocks, scale);
  } else {
    decode_kernel<QT, KT, 0>(q, k, v, tables, lens, out, B, Hq, Hkv, NB, BS, D, max_blocks, scale);
  }
}

}  // namespace

// q: [B, Hq, D]; k_pool, v_pool: [Hkv, num_blocks, block_size, D] (one layer, contiguous);
// block_tables: [B, max_blocks] int64; context_lens: [B] int64. Returns [B, Hq, D].
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 4 && v_pool.sizes() == k_pool.sizes(), "bad shapes");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), "KV pool must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong, "int64 indices");
  TORCH_CHECK(q.scalar_type() == k_pool.scalar_type(), "q and KV pool must share a dtype");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t Hkv = k_pool.size(0), NB = k_pool.size(1), BS = k_pool.size(2);
  TORCH_CHECK(k_pool.size(3) == D && Hq % Hkv == 0, "head dims do not match");
  auto out = torch::empty_like(q);
  if (q.scalar_type() == at::kFloat) {
    decode_dispatch<float, float>(q.data_ptr<float>(), k_pool.data_ptr<float>(), v_pool.data_ptr<float>(),
                                block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
                                out.data_ptr<float>(), B, Hq, Hkv, NB, BS, D, block_tables.size(1), scale);
  } else if (q.scalar_type() == at::kBFloat16) {
    decode_dispatch<at::BFloat16, at::BFloat16>(
        q.data_ptr<at::BFloat16>(), k_pool.data_ptr<at::BFloat16>(), v_pool.data_ptr<at::BFloat16>(),
        block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(), out.data_ptr<at::BFloat16>(), B, Hq,
        Hkv, NB, BS, D, block_tables.size(1), scale);
  } else {
    TORCH_CHECK(false, "paged_decode_attention supports float32 and bfloat16");
  }
  return out;
}
