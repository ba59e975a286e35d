// Block-quantized linears for small batches on CPUs: weights in blocks of 32 along K (4-bit with a
// scale and a min, as GGUF's Q4_1 / Q4_K sub-blocks; or 8-bit with a scale, as Q8_0), activations
// quantized to int8 per block of 32 at run time, and each block's dot product in integers
// (u8 x s8 multiply-adds: VNNI where the CPU has it, maddubs on plain AVX2). This is llama.cpp's
// arithmetic: at one to a few rows a linear is bound by the bytes of its weight, and 4-bit blocks
// read a quarter of bf16's bytes with one integer multiply-add per weight instead of a convert and
// an fp32 FMA. Bigger batches are compute-bound and go to oneDNN (see quantization/w4a8.py).
//
// Weight = d * q + m per block (q in 0..15 for 4-bit; m = 0 and q in -127..127 for 8-bit).
// Activation = da * qa per block, and sa = da * sum(qa), so that a 4-bit block's contribution is
// d * da * dot(q, qa) + m * sa.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kRowTile = 4;      // activation rows sharing one decoded weight block
constexpr int64_t kColGrain = 16;    // weight rows per parallel work item

template <typename T>
void quantize_blocks(const T* x, int64_t stride, int64_t rows, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t nb = K / kBlock;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const T* xb = x + r * stride + b * kBlock;
        float v[kBlock];
        float amax = 0.f;
        for (int64_t i = 0; i < kBlock; ++i) {
          v[i] = static_cast<float>(xb[i]);
          amax = std::max(amax, std::fabs(v[i]));
        }
        const float scale = amax / 127.f;
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int8_t* qb = q + r * K + b * kBlock;
        int32_t sum = 0;
        for (int64_t i = 0; i < kBlock; ++i) {
          const int32_t qi = static_cast<int32_t>(std::nearbyint(v[i] * inv));
          qb[i] = static_cast<int8_t>(std::min(127, std::max(-127, qi)));
          sum += qb[i];
        }
        d[r * nb + b] = scale;
        s[r * nb + b] = scale * static_cast<float>(sum);
      }
    }
  });
}

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Eight int32 sums of four u8 x s8 products each.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// 16 bytes of nibbles (low nibbles = elements 0..15, high = 16..31) -> 32 u8 values 0..15.
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
#endif

struct Activations {
  const int8_t* q;   // [M, K]
  const float* d;    // [M, K/32]
  const float* s;    // [M, K/32]
};

// out[m, n] for m in [m0, m0 + MT) and n in [n0, n1): 4-bit weights.
template <int MT>
void q4_tile(const uint8_t* wq, const float* wd, const float* wm, const Activations& a, int64_t K, int64_t m0,
             int64_t n0, int64_t n1, const float* bias, float* out, int64_t N) {
  const int64_t nb = K / kBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = wq + n * (K / 2);
    const float* drow = wd + n * nb;
    const float* mrow = wm + n * nb;
    float mins[MT] = {};
#if defined(__AVX2__)
    __m256 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i w = unpack_nibbles(wrow + b * 16);
      for (int t = 0; t < MT; ++t) {
        const int64_t r = m0 + t;
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + r * K + b * kBlock));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(w, x));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(drow[b] * a.d[r * nb + b]), p, acc[t]);
        mins[t] += mrow[b] * a.s[r * nb + b];
      }
    }
    for (int t = 0; t < MT; ++t) {
      const float v = hsum(acc[t]) + mins[t];
      out[(m0 + t) * N + n] = bias ? v + bias[n] : v;
    }
#else
    float acc[MT] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wb = wrow + b * 16;
      for (int t = 0; t < MT; ++t) {
        const int64_t r = m0 + t;
        const int8_t* xb = a.q + r * K + b * kBlock;
        int32_t dot = 0;
        for (int i = 0; i < 16; ++i) dot += (wb[i] & 0x0F) * xb[i] + (wb[i] >> 4) * xb[i + 16];
        acc[t] += drow[b] * a.d[r * nb + b] * static_cast<float>(dot);
        mins[t] += mrow[b] * a.s[r * nb + b];
      }
    }
    for (int t = 0; t < MT; ++t) {
      const float v = acc[t] + mins[t];
      out[(m0 + t) * N + n] = bias ? v + bias[n] : v;
    }
#endif
  }
}

// out[m, n] for m in [m0, m0 + MT) and n in [n0, n1): 8-bit weights.
template <int MT>
void q8_tile(const int8_t* wq, const float* wd, const Activations& a, int64_t K, int64_t m0, int64_t n0, int64_t n1,
             const float* bias, float* out, int64_t N) {
  const int64_t nb = K / kBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* wrow = wq + n * K;
    const float* drow = wd + n * nb;
#if defined(__AVX2__)
    __m256 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + b * kBlock));
      const __m256i wabs = _mm256_sign_epi8(w, w);   // u8 |w|; the sign moves onto x
      for (int t = 0; t < MT; ++t) {
        const int64_t r = m0 + t;
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + r * K + b * kBlock));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(wabs, _mm256_sign_epi8(x, w)));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(drow[b] * a.d[r * nb + b]), p, acc[t]);
      }
    }
    for (int t = 0; t < MT; ++t) {
      const float v = hsum(acc[t]);
      out[(m0 + t) * N + n] = bias ? v + bias[n] : v;
    }
#else
    float acc[MT] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* wb = wrow + b * kBlock;
      for (int t = 0; t < MT; ++t) {
        const int64_t r = m0 + t;
        const int8_t* xb = a.q + r * K + b * kBlock;
        int32_t dot = 0;
        for (int i = 0; i < kBlock; ++i) dot += wb[i] * xb[i];
        acc[t] += drow[b] * a.d[r * nb + b] * static_cast<float>(dot);
      }
    }
    for (int t = 0; t < MT; ++t) out[(m0 + t) * N + n] = bias ? acc[t] + bias[n] : acc[t];
#endif
  }
}

// Runs tile(MT, m0, n0, n1) over all rows: weight rows split across threads, and within a
// thread's share, activation rows in tiles of kRowTile so that each weight block is decoded once
// per tile while the share of weight rows stays in cache.
template <typename Tile>
void over_tiles(int64_t M, int64_t N, Tile tile) {
  at::parallel_for(0, N, kColGrain, [&](int64_t n0, int64_t n1) {
    int64_t m0 = 0;
    for (; m0 + kRowTile <= M; m0 += kRowTile) tile(std::integral_constant<int, 4>{}, m0, n0, n1);
    switch (M - m0) {
      case 3: tile(std::integral_constant<int, 3>{}, m0, n0, n1); break;
      case 2: tile(std::integral_constant<int, 2>{}, m0, n0, n1); break;
      case 1: tile(std::integral_constant<int, 1>{}, m0, n0, n1); break;
      default: break;
    }
  });
}

std::vector<torch::Tensor> quantize_activation_blocks(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [M, K] with unit column stride");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kBlock == 0, "K must be a multiple of 32");
  auto q = torch::empty({M, K}, x.options().dtype(at::kChar));
  auto d = torch::empty({M, K / kBlock}, x.options().dtype(at::kFloat));
  auto s = torch::empty({M, K / kBlock}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kFloat) {
    quantize_blocks<float>(x.data_ptr<float>(), x.stride(0), M, K, q.data_ptr<int8_t>(), d.data_ptr<float>(),
                           s.data_ptr<float>());
  } else if (x.scalar_type() == at::kBFloat16) {
    quantize_blocks<at::BFloat16>(x.data_ptr<at::BFloat16>(), x.stride(0), M, K, q.data_ptr<int8_t>(),
                                  d.data_ptr<float>(), s.data_ptr<float>());
  } else {
    TORCH_CHECK(false, "block quantization supports float32 and bfloat16 activations");
  }
  return {q, d, s};
}

torch::Tensor float_bias(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value()) return torch::Tensor();
  auto b = bias->to(at::kFloat).contiguous();
  TORCH_CHECK(b.dim() == 1 && b.size(0) == N, "bias must be [N]");
  return b;
}

void check_scales(const torch::Tensor& t, int64_t N, int64_t K, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 && t.size(0) == N &&
                  t.size(1) == K / kBlock,
              name, " must be contiguous float32 [N, K/32]");
}

// Quantizes x's blocks, then runs tile(MT, activations, m0, n0, n1, bias, out) over [M, N];
// returns the float32 [M, N] output.
template <typename Tile>
torch::Tensor run_block_linear(const torch::Tensor& x, const c10::optional<torch::Tensor>& bias, int64_t N, Tile tile) {
  auto parts = quantize_activation_blocks(x.stride(1) == 1 ? x : x.contiguous());
  const Activations a{parts[0].data_ptr<int8_t>(), parts[1].data_ptr<float>(), parts[2].data_ptr<float>()};
  auto b = float_bias(bias, N);
  const float* bptr = b.defined() ? b.data_ptr<float>() : nullptr;
  auto out = torch::empty({x.size(0), N}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  over_tiles(x.size(0), N, [&](auto mt, int64_t m0, int64_t n0, int64_t n1) { tile(mt, a, m0, n0, n1, bptr, o); });
  return out;
}

}  // namespace

// x: [M, K] float32/bfloat16, K a multiple of 32. Returns (int8 [M, K], float32 scales [M, K/32],
// float32 scale * sum [M, K/32]): each block of 32 quantized to amax / 127.
std::vector<torch::Tensor> quantize_blocks_q8(torch::Tensor x) {
  return quantize_activation_blocks(x.stride(1) == 1 ? x : x.contiguous());
}

// x: [M, K]; nibbles: uint8 [N, K/2], block b of row n in bytes [16b, 16b + 16) with elements
// 0..15 in the low nibbles and 16..31 in the high ones; scales, mins: float32 [N, K/32].
// Returns x W^T + bias as float32 [M, N], W = scale * q + min per block.
torch::Tensor q4_block_linear(torch::Tensor x, torch::Tensor nibbles, torch::Tensor scales, torch::Tensor mins,
                              c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(nibbles.dim() == 2 && nibbles.is_contiguous() && nibbles.scalar_type() == at::kByte,
              "nibbles must be contiguous uint8 [N, K/2]");
  const int64_t N = nibbles.size(0), K = nibbles.size(1) * 2;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K] with K = 2 * nibbles' columns");
  check_scales(scales, N, K, "scales");
  check_scales(mins, N, K, "mins");
  const uint8_t* wq = nibbles.data_ptr<uint8_t>();
  const float* wd = scales.data_ptr<float>();
  const float* wm = mins.data_ptr<float>();
  return run_block_linear(x, bias, N, [&](auto mt, const Activations& a, int64_t m0, int64_t n0, int64_t n1,
                                          const float* b, float* o) {
    q4_tile<decltype(mt)::value>(wq, wd, wm, a, K, m0, n0, n1, b, o, N);
  });
}

// x: [M, K]; qweight: int8 [N, K]; scales: float32 [N, K/32]. Returns x W^T + bias as float32
// [M, N], W = scale * q per block.
torch::Tensor q8_block_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales,
                              c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() && qweight.scalar_type() == at::kChar,
              "qweight must be contiguous int8 [N, K]");
  const int64_t N = qweight.size(0), K = qweight.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K] with K = qweight's columns");
  check_scales(scales, N, K, "scales");
  const int8_t* wq = qweight.data_ptr<int8_t>();
  const float* wd = scales.data_ptr<float>();
  return run_block_linear(x, bias, N, [&](auto mt, const Activations& a, int64_t m0, int64_t n0, int64_t n1,
                                          const float* b, float* o) {
    q8_tile<decltype(mt)::value>(wq, wd, a, K, m0, n0, n1, b, o, N);
  });
}
