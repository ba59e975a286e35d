// INT8 KV cache for CPUs: K and V stored as int8 with one fp16 scale per (token, KV head),
// K blocks transposed ([kv_heads, blocks, head_dim, block_size]) and V not
// ([kv_heads, blocks, block_size, head_dim]), scales [kv_heads, blocks, block_size].
// Attention over int8, fp8 and int4 pools is in kv_attention.cpp.
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
