// FP8 (e4m3fn) KV cache for CPUs: the int8 pool layout (K blocks transposed
// [kv_heads, blocks, head_dim, block_size], V [kv_heads, blocks, block_size, head_dim]) with
// e4m3 elements and one fp16 scale per (token, KV head) = amax / 448, so each token-head
// uses the whole e4m3 range. Values are rounded to nearest even, as torch's conversion does.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

constexpr float kE4M3Max = 448.f;

template <typename T>
void write_fp8_kernel(const T* k, const T* v, uint8_t* k_pool, uint8_t* v_pool, at::Half* k_scale, at::Half* v_scale,
                      const int64_t* slots, int64_t T_, int64_t Hkv, int64_t NB, int64_t BS, int64_t D) {
  at::parallel_for(0, T_ * Hkv, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hkv, h = item % Hkv;
      const int64_t block = slots[t] / BS, off = slots[t] % BS;
      const int64_t base = h * NB + block;
      for (int which = 0; which < 2; ++which) {
        const T* src = (which == 0 ? k : v) + (t * Hkv + h) * D;
        float amax = 0.f;
        for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(static_cast<float>(src[d])));
        // The stored (fp16-rounded) scale is the one the values are divided by.
        const at::Half s16 = at::Half(amax > 0.f ? amax / kE4M3Max : 1.f);
        const float s = static_cast<float>(s16);
        uint8_t* dst = which == 0 ? k_pool + base * D * BS + off : v_pool + (base * BS + off) * D;
        const int64_t stride = which == 0 ? BS : 1;
        for (int64_t d = 0; d < D; ++d) {
          const float x = std::clamp(static_cast<float>(src[d]) / s, -kE4M3Max, kE4M3Max);
          dst[d * stride] = c10::Float8_e4m3fn(x).x;
        }
        (which == 0 ? k_scale : v_scale)[base * BS + off] = s16;
      }
    }
  });
}

}  // namespace

// k, v: [T, Hkv, D] float32/bf16; pools float8_e4m3fn [Hkv, NB, D, BS, 1] / [Hkv, NB, BS, D, 1];
// scales fp16 [Hkv, NB, BS].
void write_kv_fp8(torch::Tensor k, torch::Tensor v, torch::Tensor k_pool, torch::Tensor v_pool, torch::Tensor k_scale,
                  torch::Tensor v_scale, torch::Tensor slot_mapping) {
  TORCH_CHECK(k_pool.scalar_type() == at::kFloat8_e4m3fn && v_pool.scalar_type() == at::kFloat8_e4m3fn, "fp8 pools");
  TORCH_CHECK(k_scale.scalar_type() == at::kHalf && v_scale.scalar_type() == at::kHalf, "fp16 scales");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_scale.is_contiguous() && v_scale.is_contiguous(),
              "contiguous pools");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "int64 slots");
  k = k.contiguous();
  v = v.contiguous();
  slot_mapping = slot_mapping.contiguous();
  const int64_t T = k.size(0), Hkv = k.size(1), D = k.size(2);
  const int64_t NB = k_pool.size(1), BS = k_pool.size(3);
  TORCH_CHECK(k_pool.size(2) == D && k_pool.size(0) == Hkv && v_pool.size(3) == D, "k/v do not match the pool");
  const auto* slots = slot_mapping.data_ptr<int64_t>();
  auto* kp = static_cast<uint8_t*>(k_pool.data_ptr());
  auto* vp = static_cast<uint8_t*>(v_pool.data_ptr());
  auto* ks = k_scale.data_ptr<at::Half>();
  auto* vs = v_scale.data_ptr<at::Half>();
  if (k.scalar_type() == at::kFloat) {
    write_fp8_kernel<float>(k.data_ptr<float>(), v.data_ptr<float>(), kp, vp, ks, vs, slots, T, Hkv, NB, BS, D);
  } else if (k.scalar_type() == at::kBFloat16) {
    write_fp8_kernel<at::BFloat16>(k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), kp, vp, ks, vs, slots, T,
                                   Hkv, NB, BS, D);
  } else {
    TORCH_CHECK(false, "write_kv_fp8 takes float32 or bfloat16 k/v");
  }
}
