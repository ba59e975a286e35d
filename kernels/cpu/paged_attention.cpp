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
    TG_DP(64, 1) TG_DP(64, 2) TG_DP(64, 3) TG_DP(64, 4) TG_DP(64, 7) TG_DP(64, 8)
    TG_DP(128, 1) TG_DP(128, 2) TG_DP(128, 4) TG_DP(128, 8)
#undef TG_DP
  }
#endif
#define TG_V16(DIM_, G_)                                                                              \
  if (P == 1 && D == DIM_ && BS == 16 && G == G_) {                                                  \
    attention_kernel_v16<QT, ST, DIM_, G_>(q, k, v, nullptr, nullptr, tables, seqs, lens, out, B, Hq, Hkv, NB,    \
                                           max_blocks, scale);                                                \
    return;                                                                                           \
  }
  TG_V16(64, 1) TG_V16(64, 2) TG_V16(64, 3) TG_V16(64, 4) TG_V16(64, 7) TG_V16(64, 8)
  TG_V16(128, 1) TG_V16(128, 2) TG_V16(128, 4) TG_V16(128, 8)
#undef TG_V16
  attention_kernel<QT, ST>(q, k, v, tables, seqs, lens, out, B, Hq, Hkv, NB, BS, D, max_blocks, scale, P);
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
