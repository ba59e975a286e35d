// Fused per-token ops of the decoder for CPUs: each replaces several torch calls (and the
// memory passes between them) by one loop over the rows, computing in fp32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

template <typename T>
inline float f32(T x) { return static_cast<float>(x); }

// residual += delta (when given); out = rms_norm(residual) * weight.
template <typename T>
void add_rms_norm_rows(T* residual, const T* delta, const float* weight, T* out, int64_t rows, int64_t H,
                       int64_t res_stride, int64_t delta_stride, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(H);
    for (int64_t r = begin; r < end; ++r) {
      T* x = residual + r * res_stride;
      float sq = 0.f;
      for (int64_t i = 0; i < H; ++i) {
        float v = f32(x[i]);
        if (delta != nullptr) {
          v += f32(delta[r * delta_stride + i]);
          x[i] = static_cast<T>(v);
          v = f32(x[i]);  // normalise the stored (rounded) residual, as the unfused path does
        }
        buf[i] = v;
        sq += v * v;
      }
      const float inv = 1.f / std::sqrt(sq / static_cast<float>(H) + eps);
      T* o = out + r * H;
      for (int64_t i = 0; i < H; ++i) o[i] = static_cast<T>(buf[i] * inv * weight[i]);
    }
  });
}

template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t I, int64_t stride) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * stride;
      const T* u = g + I;
      T* o = out + r * I;
      for (int64_t i = 0; i < I; ++i) {
        const float gv = f32(g[i]);
        o[i] = static_cast<T>(gv / (1.f + std::exp(-gv)) * f32(u[i]));
      }
    }
  });
}

// One row of the fused QKV output: rotate its Hq query and Hkv key heads (rotate-half, the
// sign folded into sin) into q and k, and copy its Hkv value heads into v. fp32 arithmetic,
// one rounding to T per value.
template <typename T>
void rope_split_rows(const T* qkv, int64_t qkv_stride, const T* cos, const T* sin, int64_t table_stride, T* q, T* k,
                     T* v, int64_t rows, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = qkv + r * qkv_stride;
      const T* c = cos + r * table_stride;
      const T* s = sin + r * table_stride;
      for (int64_t h = 0; h < Hq + Hkv; ++h) {
        const T* xh = x + h * D;
        T* o = h < Hq ? q + (r * Hq + h) * D : k + (r * Hkv + h - Hq) * D;
        for (int64_t i = 0; i < half; ++i) o[i] = static_cast<T>(f32(xh[i]) * f32(c[i]) + f32(xh[i + half]) * f32(s[i]));
        for (int64_t i = half; i < D; ++i) o[i] = static_cast<T>(f32(xh[i]) * f32(c[i]) + f32(xh[i - half]) * f32(s[i]));
      }
      std::memcpy(v + r * Hkv * D, x + (Hq + Hkv) * D, sizeof(T) * Hkv * D);
    }
  });
}

}  // namespace

// qkv: [T, (Hq + 2 Hkv) D] (query, key, value heads; unit column stride); cos, sin: [T, D] or
// [T, 1, D] with unit last stride, in qkv's dtype. Returns q [T, Hq, D] and k [T, Hkv, D]
// rotated, and v [T, Hkv, D], each contiguous: the KV write and the attention kernel read them
// as they are, where the torch path made four temporaries for the rotation and three copies.
std::vector<torch::Tensor> rope_split_qkv(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t Hq,
                                          int64_t Hkv, int64_t D) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(1) == (Hq + 2 * Hkv) * D && D % 2 == 0,
              "qkv must be [T, (Hq + 2 Hkv) D] with unit column stride");
  TORCH_CHECK(cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "cos and sin must share qkv's dtype");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.strides() == sin.strides() && cos.size(-1) == D &&
                  cos.stride(-1) == 1 && cos.numel() == qkv.size(0) * D,
              "cos and sin must be [T, D] rows with unit last stride");
  const int64_t T = qkv.size(0);
  auto q = torch::empty({T, Hq, D}, qkv.options());
  auto k = torch::empty({T, Hkv, D}, qkv.options());
  auto v = torch::empty({T, Hkv, D}, qkv.options());
  const int64_t table_stride = T > 0 ? cos.stride(0) : D;
  if (qkv.scalar_type() == at::kFloat) {
    rope_split_rows<float>(qkv.data_ptr<float>(), qkv.stride(0), cos.data_ptr<float>(), sin.data_ptr<float>(),
                           table_stride, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), T, Hq, Hkv,
                           D);
  } else if (qkv.scalar_type() == at::kBFloat16) {
    rope_split_rows<at::BFloat16>(qkv.data_ptr<at::BFloat16>(), qkv.stride(0), cos.data_ptr<at::BFloat16>(),
                                  sin.data_ptr<at::BFloat16>(), table_stride, q.data_ptr<at::BFloat16>(),
                                  k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), T, Hq, Hkv, D);
  } else {
    TORCH_CHECK(false, "rope_split_qkv supports float32 and bfloat16");
  }
  return {q, k, v};
}

// residual: [T, H] (updated in place when delta is given); weight: [H] float32. Returns [T, H].
torch::Tensor add_rms_norm(torch::Tensor residual, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps) {
  TORCH_CHECK(residual.dim() == 2 && residual.stride(1) == 1, "residual must be [T, H] with unit column stride");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous(), "weight must be contiguous float32");
  const int64_t T = residual.size(0), H = residual.size(1);
  const void* dptr = nullptr;
  int64_t dstride = 0;
  torch::Tensor d;
  if (delta.has_value()) {
    d = delta->stride(1) == 1 ? *delta : delta->contiguous();
    TORCH_CHECK(d.scalar_type() == residual.scalar_type() && d.size(0) == T && d.size(1) == H, "delta mismatch");
    dptr = d.data_ptr();
    dstride = d.stride(0);
  }
  auto out = torch::empty({T, H}, residual.options());
  if (residual.scalar_type() == at::kFloat) {
    add_rms_norm_rows<float>(residual.data_ptr<float>(), static_cast<const float*>(dptr), weight.data_ptr<float>(),
                             out.data_ptr<float>(), T, H, residual.stride(0), dstride, eps);
  } else if (residual.scalar_type() == at::kBFloat16) {
    add_rms_norm_rows<at::BFloat16>(residual.data_ptr<at::BFloat16>(), static_cast<const at::BFloat16*>(dptr),
                                    weight.data_ptr<float>(), out.data_ptr<at::BFloat16>(), T, H,
                                    residual.stride(0), dstride, eps);
  } else {
    TORCH_CHECK(false, "add_rms_norm supports float32 and bfloat16");
  }
  return out;
}

// gate_up: [T, 2I] (gate then up). Returns silu(gate) * up as [T, I].
torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0, "gate_up must be [T, 2I]");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({T, I}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    silu_mul_rows<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), T, I, gate_up.stride(0));
  } else if (gate_up.scalar_type() == at::kBFloat16) {
    silu_mul_rows<at::BFloat16>(gate_up.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), T, I,
                                gate_up.stride(0));
  } else {
    TORCH_CHECK(false, "silu_mul supports float32 and bfloat16");
  }
  return out;
}
