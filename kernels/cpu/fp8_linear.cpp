// FP8 (e4m3fn) weight-only linear layers for CPUs: y = (x W8^T) * scale[n], with W8 the
// stored e4m3 weight [N, K] and one fp32 scale per output channel applied to the output.
// Few rows (decode): one fused pass that converts each 16-weight chunk in registers and
// multiplies it into every row, reading each weight byte once per call. Many rows: the
// caller converts the weight to bf16 once per call (fp8_to_bf16, exact) and runs a bf16 GEMM.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// R output channels per work item: each x chunk is loaded once for R of them; R * M
// accumulators must stay in the 32 vector registers.
template <typename T, int M, int R = (M <= 4 ? 4 : 2)>
void fp8_gemv_kernel(const T* x, const Fp8E4M3* w, const float* scale, T* y, int64_t N, int64_t K) {
  std::vector<float> xf(M * K);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = static_cast<float>(x[i]);
  const int64_t items = (N + R - 1) / R;
  at::parallel_for(0, items, 8, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n0 = item * R;
      const int rows = static_cast<int>(std::min<int64_t>(R, N - n0));
      v16f acc[R][M];
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < M; ++m) acc[r][m] = v16f{};
      int64_t k = 0;
      for (; k + 16 <= K; k += 16) {
        v16f wv[R];
        for (int r = 0; r < rows; ++r) wv[r] = load16(w + (n0 + r) * K + k);
        for (int m = 0; m < M; ++m) {
          const v16f xv = load16(xf.data() + m * K + k);
          for (int r = 0; r < rows; ++r) acc[r][m] += xv * wv[r];
        }
      }
      for (int r = 0; r < rows; ++r) {
        const float s = scale[n0 + r] * kFp8Unit;
        for (int m = 0; m < M; ++m) {
          float sum = 0.f;
          for (int l = 0; l < 16; ++l) sum += acc[r][m][l];
          for (int64_t kk = k; kk < K; ++kk) sum += xf[m * K + kk] * (fp8_to_f32(w[(n0 + r) * K + kk].bits) / kFp8Unit);
          y[m * N + n0 + r] = static_cast<T>(sum * s);
        }
      }
    }
  });
}

template <typename T>
bool fp8_gemv_dispatch(const T* x, const Fp8E4M3* w, const float* scale, T* y, int64_t M, int64_t N, int64_t K) {
  switch (M) {
#define TG_M(M_) \
  case M_:       \
    fp8_gemv_kernel<T, M_>(x, w, scale, y, N, K); \
    return true;
    TG_M(1) TG_M(2) TG_M(3) TG_M(4) TG_M(5) TG_M(6) TG_M(7) TG_M(8)
#undef TG_M
    default:
      return false;
  }
}

}  // namespace

// x: [M, K] float32/bf16 with M <= 8; w: [N, K] float8_e4m3fn; scale: [N] float32. Returns [M, N].
torch::Tensor fp8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scale) {
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.dim() == 2 && w.is_contiguous(), "w: contiguous fp8 [N, K]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == w.size(0),
              "scale: float32 [N]");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "x must be [M, K]");
  x = x.contiguous();
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  auto y = torch::empty({M, N}, x.options());
  const auto* wp = static_cast<const Fp8E4M3*>(w.data_ptr());
  bool done = false;
  if (x.scalar_type() == at::kFloat) {
    done = fp8_gemv_dispatch<float>(x.data_ptr<float>(), wp, scale.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
  } else if (x.scalar_type() == at::kBFloat16) {
    done = fp8_gemv_dispatch<at::BFloat16>(x.data_ptr<at::BFloat16>(), wp, scale.data_ptr<float>(),
                                           y.data_ptr<at::BFloat16>(), M, N, K);
  }
  TORCH_CHECK(done, "fp8_linear takes float32/bfloat16 x with 1 to 8 rows");
  return y;
}

// w: float8_e4m3fn (any shape, contiguous) -> the same values in bfloat16 (exact: e4m3 has
// fewer exponent and mantissa bits than bf16).
torch::Tensor fp8_to_bf16(torch::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.is_contiguous(), "contiguous fp8 tensor");
  auto out = torch::empty(w.sizes(), w.options().dtype(at::kBFloat16));
  const auto* src = static_cast<const Fp8E4M3*>(w.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t n = w.numel(), chunks = n / 16;
  at::parallel_for(0, chunks, 4096, [&](int64_t begin, int64_t end) {
    typedef uint32_t v16u __attribute__((vector_size(64)));
    typedef uint16_t v16h __attribute__((vector_size(32)));
    for (int64_t c = begin; c < end; ++c) {
      const v16f f = load16(src + c * 16) * kFp8Unit;
      v16u bits;
      std::memcpy(&bits, &f, 64);
      const v16h top = __builtin_convertvector(bits >> 16, v16h);   // exact: the low mantissa bits are zero
      std::memcpy(dst + c * 16, &top, 32);
    }
  });
  for (int64_t i = chunks * 16; i < n; ++i) {
    const float f = fp8_to_f32(src[i].bits);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    dst[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}
