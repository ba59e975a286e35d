// INT8 KV cache for CPUs: K and V stored as int8 with one fp16 scale per (token, KV head),
// K blocks transposed ([kv_heads, blocks, head_dim, block_size]) and V not
// ([kv_heads, blocks, block_size, head_dim]), scales [kv_heads, blocks, block_size].
// Attention reuses the 16-lane kernel of attention_fp32.cpp, which multiplies a token's
// score by its K scale and its probability by its V scale: one multiply per token, not per
// element.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

template <typename T>
void write_int8_kernel(const T* k, const T* v, int8_t* k_pool, int8_t* v_pool, at::Half* k_scale, at::Half* v_scale,
                       const int64_t* slots, int64_t T_, int64_t Hkv, int64_t NB, int64_t BS, int64_t D) {
  at::parallel_for(0, T_ * Hkv, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hkv, h = item % Hkv;
      const int64_t block = slots[t] / BS, off = slots[t] % BS;
      for (int which = 0; which < 2; ++which) {
        const T* src = (which == 0 ? k : v) + (t * Hkv + h) * D;
        float amax = 0.f;
        for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(static_cast<float>(src[d])));
        // Round the scale to fp16 first, so the stored scale is the one the values were divided by.
        const at::Half s16 = at::Half(amax > 0.f ? amax / 127.f : 1.f);
        const float inv = 1.f / static_cast<float>(s16);
        const int64_t base = (h * NB + block);
        if (which == 0) {
          int8_t* dst = k_pool + base * D * BS + off;
          for (int64_t d = 0; d < D; ++d)
            dst[d * BS] = static_cast<int8_t>(std::lrint(std::clamp(static_cast<float>(src[d]) * inv, -127.f, 127.f)));
          k_scale[base * BS + off] = s16;
        } else {
          int8_t* dst = v_pool + (base * BS + off) * D;
          for (int64_t d = 0; d < D; ++d)
            dst[d] = static_cast<int8_t>(std::lrint(std::clamp(static_cast<float>(src[d]) * inv, -127.f, 127.f)));
          v_scale[base * BS + off] = s16;
        }
      }
    }
  });
}

template <typename QT>
bool attention_int8_dispatch(const QT* q, const int8_t* k, const int8_t* v, const at::Half* ks, const at::Half* vs,
                             const int64_t* tables, const int64_t* seqs, const int64_t* lens, QT* out, int64_t B,
                             int64_t Hq, int64_t Hkv, int64_t NB, int64_t D, int64_t max_blocks, float scale) {
  const int64_t G = Hq / Hkv;
#define TG_I8(DIM_, G_)                                                                                       \
  if (D == DIM_ && G == G_) {                                                                                 \
    attention_kernel_v16<QT, int8_t, DIM_, G_>(q, k, v, ks, vs, tables, seqs, lens, out, B, Hq, Hkv, NB,     \
                                               max_blocks, scale);                                            \
    return true;                                                                                              \
  }
  TG_I8(64, 1) TG_I8(64, 2) TG_I8(64, 3) TG_I8(64, 4) TG_I8(64, 8)
  TG_I8(128, 1) TG_I8(128, 2) TG_I8(128, 4) TG_I8(128, 8)
#undef TG_I8
  return false;
}

}  // namespace

// k, v: [T, Hkv, D] float32/bf16; pools int8 [Hkv, NB, D, BS, 1] / [Hkv, NB, BS, D, 1]; scales fp16 [Hkv, NB, BS].
void write_kv_int8(torch::Tensor k, torch::Tensor v, torch::Tensor k_pool, torch::Tensor v_pool, torch::Tensor k_scale,
                   torch::Tensor v_scale, torch::Tensor slot_mapping) {
  TORCH_CHECK(k_pool.scalar_type() == at::kChar && v_pool.scalar_type() == at::kChar, "int8 pools");
  TORCH_CHECK(k_scale.scalar_type() == at::kHalf && v_scale.scalar_type() == at::kHalf, "fp16 scales");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_scale.is_contiguous() && v_scale.is_contiguous(),
              "contiguous pools");
  k = k.contiguous();
  v = v.contiguous();
  slot_mapping = slot_mapping.contiguous();
  const int64_t T = k.size(0), Hkv = k.size(1), D = k.size(2);
  const int64_t NB = k_pool.size(1), BS = k_pool.size(3);
  TORCH_CHECK(k_pool.size(2) == D && k_pool.size(0) == Hkv, "k/v do not match the pool");
  const auto* slots = slot_mapping.data_ptr<int64_t>();
  auto* kp = k_pool.data_ptr<int8_t>();
  auto* vp = v_pool.data_ptr<int8_t>();
  auto* ks = k_scale.data_ptr<at::Half>();
  auto* vs = v_scale.data_ptr<at::Half>();
  if (k.scalar_type() == at::kFloat) {
    write_int8_kernel<float>(k.data_ptr<float>(), v.data_ptr<float>(), kp, vp, ks, vs, slots, T, Hkv, NB, BS, D);
  } else if (k.scalar_type() == at::kBFloat16) {
    write_int8_kernel<at::BFloat16>(k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), kp, vp, ks, vs, slots, T,
                                    Hkv, NB, BS, D);
  } else {
    TORCH_CHECK(false, "write_kv_int8 takes float32 or bfloat16 k/v");
  }
}

torch::Tensor paged_attention_int8(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool, torch::Tensor k_scale,
                                   torch::Tensor v_scale, torch::Tensor block_tables, torch::Tensor seq_of_token,
                                   torch::Tensor context_lens, double scale) {
  TORCH_CHECK(k_pool.scalar_type() == at::kChar && k_pool.size(3) == 16, "int8 pool with 16-token blocks");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  seq_of_token = seq_of_token.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(0), NB = k_pool.size(1);
  auto out = torch::empty_like(q);
  bool done = false;
  if (q.scalar_type() == at::kFloat) {
    done = attention_int8_dispatch<float>(
        q.data_ptr<float>(), k_pool.data_ptr<int8_t>(), v_pool.data_ptr<int8_t>(), k_scale.data_ptr<at::Half>(),
        v_scale.data_ptr<at::Half>(), block_tables.data_ptr<int64_t>(), seq_of_token.data_ptr<int64_t>(),
        context_lens.data_ptr<int64_t>(), out.data_ptr<float>(), T, Hq, Hkv, NB, D, block_tables.size(1), scale);
  } else if (q.scalar_type() == at::kBFloat16) {
    done = attention_int8_dispatch<at::BFloat16>(
        q.data_ptr<at::BFloat16>(), k_pool.data_ptr<int8_t>(), v_pool.data_ptr<int8_t>(),
        k_scale.data_ptr<at::Half>(), v_scale.data_ptr<at::Half>(), block_tables.data_ptr<int64_t>(),
        seq_of_token.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(), out.data_ptr<at::BFloat16>(), T, Hq,
        Hkv, NB, D, block_tables.size(1), scale);
  }
  TORCH_CHECK(done, "paged_attention_int8: unsupported head size / grouping / dtype");
  return out;
}
