// W8A8 linear for CPUs: activations quantized to int8 per row (token) at run time, weights int8
// per output channel, the product in int32 by oneDNN's VNNI GEMM (at::_int_mm), and the scales
// applied on the way back. One call per linear: the quantize and dequantize passes would otherwise
// be five or six torch ops each, whose dispatch costs more than the GEMM at small batches.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

// q = round(x * 127 / amax(row)), scale = amax / 127 (rows of zeros: scale 1, q 0).
template <typename T>
void quantize_rows(const T* x, int8_t* q, float* scale, int64_t rows, int64_t K, int64_t stride) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * stride;
      float amax = 0.f;
      for (int64_t i = 0; i < K; ++i) amax = std::max(amax, std::fabs(static_cast<float>(xr[i])));
      const bool zero = !(amax > 0.f);
      const float inv = zero ? 0.f : 127.f / amax;
      scale[r] = zero ? 1.f : amax / 127.f;
      int8_t* qr = q + r * K;
      for (int64_t i = 0; i < K; ++i) {
        const float v = std::nearbyint(static_cast<float>(xr[i]) * inv);
        qr[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
      }
    }
  });
}

// out[r, n] = acc[r, n] * (row_scale[r] * col_scale[n]) + bias[n]
template <typename T>
void dequantize_rows(const int32_t* acc, const float* row_scale, const float* col_scale, const float* bias, T* out,
                     int64_t rows, int64_t N) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t* a = acc + r * N;
      const float rs = row_scale[r];
      T* o = out + r * N;
      if (bias != nullptr) {
        for (int64_t n = 0; n < N; ++n) o[n] = static_cast<T>(static_cast<float>(a[n]) * (rs * col_scale[n]) + bias[n]);
      } else {
        for (int64_t n = 0; n < N; ++n) o[n] = static_cast<T>(static_cast<float>(a[n]) * (rs * col_scale[n]));
      }
    }
  });
}

template <typename T>
void quantize_dispatch(const torch::Tensor& x, torch::Tensor& q, torch::Tensor& scale) {
  quantize_rows<T>(x.data_ptr<T>(), q.data_ptr<int8_t>(), scale.data_ptr<float>(), x.size(0), x.size(1), x.stride(0));
}

}  // namespace

// x: [M, K] float32 or bfloat16 (unit column stride). Returns (int8 [M, K], float32 scales [M]).
std::vector<torch::Tensor> quantize_rows_int8(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [M, K] with unit column stride");
  auto q = torch::empty({x.size(0), x.size(1)}, x.options().dtype(at::kChar));
  auto scale = torch::empty({x.size(0)}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kFloat) {
    quantize_dispatch<float>(x, q, scale);
  } else if (x.scalar_type() == at::kBFloat16) {
    quantize_dispatch<at::BFloat16>(x, q, scale);
  } else {
    TORCH_CHECK(false, "quantize_rows_int8 supports float32 and bfloat16");
  }
  return {q, scale};
}

// x: [M, K] float32/bfloat16; qweight: [N, K] int8; col_scale: [N] float32; bias: [N] or none.
// Returns x W^T + b as [M, N] in x's dtype, with x quantized per row to int8.
torch::Tensor w8a8_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor col_scale,
                          c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() && qweight.scalar_type() == at::kChar,
              "qweight must be contiguous int8 [N, K]");
  TORCH_CHECK(col_scale.scalar_type() == at::kFloat && col_scale.is_contiguous() && col_scale.size(0) == qweight.size(0),
              "col_scale must be contiguous float32 [N]");
  const int64_t N = qweight.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == qweight.size(1), "x must be [M, K] with K = qweight's columns");
  auto parts = quantize_rows_int8(x.stride(1) == 1 ? x : x.contiguous());
  // [K, N] with strides (1, K): the weight as stored, read as its transpose without a copy.
  auto acc = at::_int_mm(parts[0], qweight.t());
  auto out = torch::empty({x.size(0), N}, x.options());
  const float* bptr = nullptr;
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.size(0) == N, "bias must be [N]");
    bptr = b.data_ptr<float>();
  }
  const int32_t* a = acc.data_ptr<int32_t>();
  const float* rs = parts[1].data_ptr<float>();
  if (x.scalar_type() == at::kFloat) {
    dequantize_rows<float>(a, rs, col_scale.data_ptr<float>(), bptr, out.data_ptr<float>(), x.size(0), N);
  } else {
    dequantize_rows<at::BFloat16>(a, rs, col_scale.data_ptr<float>(), bptr, out.data_ptr<at::BFloat16>(), x.size(0), N);
  }
  return out;
}
