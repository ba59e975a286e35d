// INT4 KV cache for CPUs (the self-speculative draft's cache): per (token, KV head) an
// asymmetric 4-bit grid, x ~= q * scale + zero with q in 0..15, zero = min, scale =
// (max - min) / 15, both fp16. Two values per byte: byte j of a token-head holds head dims j
// (low nibble) and j + D/2 (high nibble). K blocks are transposed ([kv_heads, blocks, D/2,
// block_size] bytes), V blocks are not ([kv_heads, blocks, block_size, D/2]); scales and
// zeros sit in [kv_heads, blocks, 2, block_size] (row 0 scales, row 1 zeros).
// 36 bytes per token-head against 128 in bf16.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

template <typename T>
void write_int4_kernel(const T* k, const T* v, uint8_t* k_pool, uint8_t* v_pool, at::Half* k_scale, at::Half* v_scale,
                       const int64_t* slots, int64_t T_, int64_t Hkv, int64_t NB, int64_t BS, int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, T_ * Hkv, 64, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> q(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hkv, h = item % Hkv;
      const int64_t block = slots[t] / BS, off = slots[t] % BS;
      const int64_t base = h * NB + block;
      for (int which = 0; which < 2; ++which) {
        const T* src = (which == 0 ? k : v) + (t * Hkv + h) * D;
        float lo = std::numeric_limits<float>::infinity(), hi = -lo;
        for (int64_t d = 0; d < D; ++d) {
          const float x = static_cast<float>(src[d]);
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
        // Quantize against the stored (fp16-rounded) scale and zero.
        const at::Half s16 = at::Half(hi > lo ? (hi - lo) / 15.f : 1.f), z16 = at::Half(lo);
        const float s = static_cast<float>(s16), z = static_cast<float>(z16);
        for (int64_t d = 0; d < D; ++d)
          q[d] = static_cast<uint8_t>(std::clamp(std::nearbyint((static_cast<float>(src[d]) - z) / s), 0.f, 15.f));
        uint8_t* dst = which == 0 ? k_pool + base * half * BS + off : v_pool + (base * BS + off) * half;
        const int64_t stride = which == 0 ? BS : 1;
        for (int64_t j = 0; j < half; ++j) dst[j * stride] = static_cast<uint8_t>(q[j] | (q[j + half] << 4));
        at::Half* sc = (which == 0 ? k_scale : v_scale) + base * 2 * BS + off;
        sc[0] = s16;
        sc[BS] = z16;
      }
    }
  });
}

}  // namespace

// k, v: [T, Hkv, D] float32/bf16; pools uint8 [Hkv, NB, D/2, BS, 1] / [Hkv, NB, BS, D/2, 1];
// scales fp16 [Hkv, NB, 2, BS] (scale row, zero row).
void write_kv_int4(torch::Tensor k, torch::Tensor v, torch::Tensor k_pool, torch::Tensor v_pool, torch::Tensor k_scale,
                   torch::Tensor v_scale, torch::Tensor slot_mapping) {
  TORCH_CHECK(k_pool.scalar_type() == at::kByte && v_pool.scalar_type() == at::kByte, "uint8 (packed int4) pools");
  TORCH_CHECK(k_scale.scalar_type() == at::kHalf && v_scale.scalar_type() == at::kHalf, "fp16 scales");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_scale.is_contiguous() && v_scale.is_contiguous(),
              "contiguous pools");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "int64 slots");
  k = k.contiguous();
  v = v.contiguous();
  slot_mapping = slot_mapping.contiguous();
  const int64_t T = k.size(0), Hkv = k.size(1), D = k.size(2);
  const int64_t NB = k_pool.size(1), BS = k_pool.size(3);
  TORCH_CHECK(D % 2 == 0 && k_pool.size(2) * 2 == D && k_pool.size(0) == Hkv && v_pool.size(3) * 2 == D,
              "k/v do not match the pool");
  TORCH_CHECK(k_scale.dim() == 4 && k_scale.size(2) == 2 && k_scale.size(3) == BS, "scales must be [Hkv, NB, 2, BS]");
  const auto* slots = slot_mapping.data_ptr<int64_t>();
  auto* kp = k_pool.data_ptr<uint8_t>();
  auto* vp = v_pool.data_ptr<uint8_t>();
  auto* ks = k_scale.data_ptr<at::Half>();
  auto* vs = v_scale.data_ptr<at::Half>();
  if (k.scalar_type() == at::kFloat) {
    write_int4_kernel<float>(k.data_ptr<float>(), v.data_ptr<float>(), kp, vp, ks, vs, slots, T, Hkv, NB, BS, D);
  } else if (k.scalar_type() == at::kBFloat16) {
    write_int4_kernel<at::BFloat16>(k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), kp, vp, ks, vs, slots, T,
                                    Hkv, NB, BS, D);
  } else {
    TORCH_CHECK(false, "write_kv_int4 takes float32 or bfloat16 k/v");
  }
}
