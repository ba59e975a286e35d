// Block-quantized linears for small batches on CPUs: weights in blocks of 32 along K (4-bit with a
// scale and a min, as GGUF's Q4_1 / Q4_K sub-blocks; or 8-bit with a scale, as Q8_0), activations
// quantized to int8 per block of 32 at run time, and each block's dot product in integers
// (u8 x s8 multiply-adds: VNNI where the CPU has it, maddubs on plain AVX2). This is llama.cpp's
// arithmetic: at one to a few rows a linear is bound by the bytes of its weight, and 4-bit blocks
// read a quarter of bf16's bytes with one integer multiply-add per weight instead of a convert and
// an fp32 FMA. At batch 16 and beyond a linear is compute-bound, and the integer multiply-adds
// (32 per instruction, against 8 fp32 FMAs) keep the same kernel ahead of oneDNN's fp32 GEMM.
//
// Weight = d * q + m per block (q in 0..15 for 4-bit; m = 0 and q in -127..127 for 8-bit).
// Activation = da * qa per block, and sa = da * sum(qa), so that a 4-bit block's contribution is
// d * da * dot(q, qa) + m * sa.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using block_tiles::Activations;
using block_tiles::kBlock;
using block_tiles::Output;
using block_tiles::write_group;

constexpr int64_t kGroupGrain = 4;   // column groups of 8 per parallel work item

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

// 4 int8 activations repeated in every 32-bit lane.
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Running sums of u8 x s8 products per 32-bit lane. With VNNI they are int32 from the start; on
// plain AVX2 maddubs leaves int16 pairs, which hold a 4-bit block's eight multiply-adds (at most
// 8 * 2 * 15 * 127 = 30,480) before finish_u8s8 widens them once.
inline __m256i accumulate_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
#endif
}

inline __m256i finish_u8s8(__m256i acc) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  return acc;
#else
  return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
#endif
}
#endif

// Whether the AVX2 tiles request the next column groups' blocks ahead of use. One or two rows
// wait on memory, and the requests pay; with more rows the multiply-adds hide the loads and the
// requests only cost issue slots (AVX2 build on an AMD EPYC Zen 4, SmolLM2's 30 layers of 4-bit
// linears: one row ~15 % faster, four rows ~12 % and 32 rows ~8 % slower with them). AVX-512
// builds reach these tiles only for row counts their pair tiles leave: not measured, left as
// they were.
template <int MT>
constexpr bool kReadAhead = MT <= 2 && !TIERGATE_BLOCK_AVX512;

// 4-bit weights interleaved by column groups of 8 (see w4a8.py, interleave_q4): for group g and
// block b, 128 bytes as 4 vectors of 32; vector j holds, for columns c = 0..7 and kk = 0..3 at
// byte 4c + kk, weight k = 4j + kk of the block in the low nibble and k = 16 + 4j + kk in the
// high one. A vector of 8 int32 lanes is then 8 output columns: each row's 4 activation bytes
// are broadcast to all lanes, so one u8 x s8 multiply-add serves 8 columns, the block's integer
// sums reach floating point once per block, and the block scales and mins of the 8 columns
// are one vector load each.
//
// NG groups at once (groups g .. g + NG): each row's broadcast activations serve all of them,
// and with one or two rows the groups' chains keep more multiply-adds in flight; where
// kReadAhead holds, the next NG groups' blocks are requested while these are multiplied (the
// AVX-512 tiles' read-ahead).
//
// out[m, 8g .. 8g + 8 NG) for m in [m0, m0 + MT).
template <int MT, int NG>
void q4_groups(const uint8_t* wq, const float* wd, const float* wm, const Activations& a, int64_t K, int64_t m0,
               int64_t g, const Output& out) {
  const int64_t nb = K / kBlock;
  const uint8_t* wg = wq + g * nb * 128;
  const float* dg = wd + g * nb * 8;
  const float* mg = wm + g * nb * 8;
  float res[NG][MT][8];
#if defined(__AVX2__)
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[NG][MT];
  for (int n = 0; n < NG; ++n)
    for (int t = 0; t < MT; ++t) acc[n][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int n = 0; n < (kReadAhead<MT> ? NG : 0); ++n) {
      const int64_t ahead = (NG + n) * nb + b;      // this block of the group NG further on
      __builtin_prefetch(wg + ahead * 128, 0, 1);
      __builtin_prefetch(wg + ahead * 128 + 64, 0, 1);
      __builtin_prefetch(dg + ahead * 8, 0, 1);
      __builtin_prefetch(mg + ahead * 8, 0, 1);
    }
    __m256i isum[NG][MT];
    for (int n = 0; n < NG; ++n)
      for (int t = 0; t < MT; ++t) isum[n][t] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256i lo[NG], hi[NG];
      for (int n = 0; n < NG; ++n) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + (n * nb + b) * 128 + 32 * j));
        lo[n] = _mm256_and_si256(raw, low);
        hi[n] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      }
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = a.q + (m0 + t) * K + b * kBlock + 4 * j;
        const __m256i xl = broadcast4(xb), xh = broadcast4(xb + 16);
        for (int n = 0; n < NG; ++n) {
          isum[n][t] = accumulate_u8s8(isum[n][t], lo[n], xl);
          isum[n][t] = accumulate_u8s8(isum[n][t], hi[n], xh);
        }
      }
    }
    for (int n = 0; n < NG; ++n) {
      const __m256 dw = _mm256_loadu_ps(dg + (n * nb + b) * 8);
      const __m256 mw = _mm256_loadu_ps(mg + (n * nb + b) * 8);
      for (int t = 0; t < MT; ++t) {
        const int64_t r = (m0 + t) * nb + b;
        const __m256 p = _mm256_cvtepi32_ps(finish_u8s8(isum[n][t]));
        acc[n][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.d[r])), acc[n][t]);
        acc[n][t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[r]), acc[n][t]);
      }
    }
  }
  for (int n = 0; n < NG; ++n)
    for (int t = 0; t < MT; ++t) _mm256_storeu_ps(res[n][t], acc[n][t]);
#else
  for (int n = 0; n < NG; ++n)
    for (int t = 0; t < MT; ++t)
      for (int c = 0; c < 8; ++c) res[n][t][c] = 0.f;
  for (int n = 0; n < NG; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wb = wg + (n * nb + b) * 128;
      for (int t = 0; t < MT; ++t) {
        const int64_t r = (m0 + t) * nb + b;
        const int8_t* xb = a.q + (m0 + t) * K + b * kBlock;
        for (int c = 0; c < 8; ++c) {
          int32_t dot = 0;
          for (int j = 0; j < 4; ++j)
            for (int kk = 0; kk < 4; ++kk) {
              const uint8_t byte = wb[32 * j + 4 * c + kk];
              dot += (byte & 0x0F) * xb[4 * j + kk] + (byte >> 4) * xb[16 + 4 * j + kk];
            }
          res[n][t][c] += static_cast<float>(dot) * (dg[(n * nb + b) * 8 + c] * a.d[r]);
          res[n][t][c] += mg[(n * nb + b) * 8 + c] * a.s[r];
        }
      }
    }
#endif
  for (int n = 0; n < NG; ++n) write_group<MT>(res[n], out, m0, g + n);
}

// 8-bit weights interleaved the same way (interleave_q8): for group g and block b, 256 bytes as
// 8 vectors of 32; vector j holds weight k = 4j + kk of column c at byte 4c + kk. u8 x s8
// multiply-adds need an unsigned side, so the weight's sign moves onto the activation
// (llama.cpp's trick); the int16 pairs of two such products can reach 2 * 127 * 127, so each is
// widened to int32 at once on plain AVX2.
//
// kStreamed: the weight is larger than the caches (q8_pair's), so where kReadAhead holds the
// next group's block is requested while this one is multiplied.
//
// out[m, 8g .. 8g + 8) for m in [m0, m0 + MT) and g in [g0, g1).
template <int MT, bool kStreamed>
void q8_groups(const int8_t* wq, const float* wd, const Activations& a, int64_t K, int64_t m0, int64_t g0,
               int64_t g1, const Output& out) {
  const int64_t nb = K / kBlock;
  for (int64_t g = g0; g < g1; ++g) {
    const int8_t* wg = wq + g * nb * 256;
    const float* dg = wd + g * nb * 8;
    float res[MT][8];
#if defined(__AVX2__)
    __m256 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* wb = wg + b * 256;
      if (kStreamed && kReadAhead<MT>)
        for (int line = 0; line < 4; ++line) __builtin_prefetch(wb + nb * 256 + 64 * line, 0, 1);
      __m256i isum[MT];
      for (int t = 0; t < MT; ++t) isum[t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
        const __m256i wabs = _mm256_sign_epi8(w, w);
        for (int t = 0; t < MT; ++t) {
          const __m256i x = _mm256_sign_epi8(broadcast4(a.q + (m0 + t) * K + b * kBlock + 4 * j), w);
          isum[t] = _mm256_add_epi32(isum[t], dot_u8s8(wabs, x));
        }
      }
      const __m256 dw = _mm256_loadu_ps(dg + b * 8);
      for (int t = 0; t < MT; ++t) {
        const __m256 p = _mm256_cvtepi32_ps(isum[t]);
        acc[t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.d[(m0 + t) * nb + b])), acc[t]);
      }
    }
    for (int t = 0; t < MT; ++t) _mm256_storeu_ps(res[t], acc[t]);
#else
    for (int t = 0; t < MT; ++t)
      for (int c = 0; c < 8; ++c) res[t][c] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* wb = wg + b * 256;
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = a.q + (m0 + t) * K + b * kBlock;
        for (int c = 0; c < 8; ++c) {
          int32_t dot = 0;
          for (int j = 0; j < 8; ++j)
            for (int kk = 0; kk < 4; ++kk) dot += wb[32 * j + 4 * c + kk] * xb[4 * j + kk];
          res[t][c] += static_cast<float>(dot) * (dg[b * 8 + c] * a.d[(m0 + t) * nb + b]);
        }
      }
    }
#endif
    write_group<MT>(res, out, m0, g);
  }
}

// Column groups g0 .. g1: two at a time in 16-lane registers where the CPU has AVX-512 VNNI
// (block_tiles_avx512.cpp), two at a time in 8-lane registers for one or two rows on AVX2, the
// rest one at a time.
template <int MT>
void q4_tile(const uint8_t* wq, const float* wd, const float* wm, const Activations& a, int64_t K, int64_t m0,
             int64_t g0, int64_t g1, const Output& out) {
  int64_t g = g0;
#if TIERGATE_BLOCK_AVX512
  if constexpr (block_tiles::kPairTile<MT>)
    for (; g + 1 < g1; g += 2) block_tiles::q4_pair<MT>(wq, wd, wm, a, K, m0, g, out);
#else
  // AVX2's 16 registers hold two groups' sums for one or two rows.
  if constexpr (MT <= 2)
    for (; g + 1 < g1; g += 2) q4_groups<MT, 2>(wq, wd, wm, a, K, m0, g, out);
#endif
  for (; g < g1; ++g) q4_groups<MT, 1>(wq, wd, wm, a, K, m0, g, out);
}

template <int MT>
void q8_tile(const int8_t* wq, const float* wd, const Activations& a, int64_t K, int64_t m0, int64_t g0,
             int64_t g1, const Output& out, bool streamed) {
  int64_t g = g0;
#if TIERGATE_BLOCK_AVX512
  if constexpr (block_tiles::kPairTile<MT>) {
    if (a.sums128 != nullptr) {
      if (streamed)
        for (; g + 1 < g1; g += 2) block_tiles::q8_pair<MT, true>(wq, wd, a, K, m0, g, out);
      else
        for (; g + 1 < g1; g += 2) block_tiles::q8_pair<MT, false>(wq, wd, a, K, m0, g, out);
    }
  }
#endif
  if (streamed)
    q8_groups<MT, true>(wq, wd, a, K, m0, g, g1, out);
  else
    q8_groups<MT, false>(wq, wd, a, K, m0, g, g1, out);
}

// Runs tile(MT, m0, g0, g1) over all rows: column groups split across threads; within a thread's
// share, rows in blocks of kRowBlock, each block's rows over the share's groups a chunk at a time
// (about kChunkBytes of weights, which stay in cache while every row tile of the block reads
// them), and rows in tiles of kRowTile, so that each weight vector is decoded once per tile.
// Without the chunks, a weight larger than the cache (a 49,152-row output head) would be read
// from memory once per row tile.
constexpr int64_t kRowBlock = 64;
// Weights past this size come from memory at every call (q8_pair's kStreamed).
constexpr int64_t kStreamedWeightBytes = 4 << 20;
constexpr int64_t kChunkBytes = 64 * 1024;

template <typename Tile>
void over_tiles(int64_t M, int64_t groups, int64_t bytes_per_group, Tile tile) {
  // An even chunk keeps the AVX-512 tiles' pairs of groups whole.
  const int64_t chunk = std::max<int64_t>(2, kChunkBytes / bytes_per_group / 2 * 2);
  at::parallel_for(0, groups, kGroupGrain, [&](int64_t g0, int64_t g1) {
    for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) {
      const int64_t r1 = std::min(M, r0 + kRowBlock);
      for (int64_t c0 = g0; c0 < g1; c0 += chunk) {
        const int64_t c1 = std::min(g1, c0 + chunk);
        int64_t m0 = r0;
        for (; m0 + block_tiles::kRowTile <= r1; m0 += block_tiles::kRowTile)
          tile(std::integral_constant<int, block_tiles::kRowTile>{}, m0, c0, c1);
        switch (r1 - m0) {
          case 7: tile(std::integral_constant<int, 7>{}, m0, c0, c1); break;
          case 6: tile(std::integral_constant<int, 6>{}, m0, c0, c1); break;
          case 5: tile(std::integral_constant<int, 5>{}, m0, c0, c1); break;
          case 4: tile(std::integral_constant<int, 4>{}, m0, c0, c1); break;
          case 3: tile(std::integral_constant<int, 3>{}, m0, c0, c1); break;
          case 2: tile(std::integral_constant<int, 2>{}, m0, c0, c1); break;
          case 1: tile(std::integral_constant<int, 1>{}, m0, c0, c1); break;
          default: break;
        }
      }
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

// A packed weight: [groups, K/32, bytes_per_block] of the given type, with scales (and mins)
// [groups, K/32, 8] float32; returns K.
int64_t check_packed(const torch::Tensor& w, at::ScalarType type, int64_t bytes_per_block, int64_t N,
                     const torch::Tensor& scales) {
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && w.scalar_type() == type && w.size(2) == bytes_per_block &&
                  w.size(0) == (N + 7) / 8,
              "packed weight must be contiguous [ceil(N/8), K/32, ", bytes_per_block, "]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == w.size(0) && scales.size(1) == w.size(1) && scales.size(2) == 8,
              "scales and mins must be contiguous float32 [ceil(N/8), K/32, 8]");
  return w.size(1) * kBlock;
}

// Quantizes x's blocks, then runs tile(MT, activations, m0, g0, g1, out) over M rows and
// ceil(N/8) column groups; returns the [M, N] output, in x's dtype unless `float_output` (an
// output head's logits) asks for float32. (q8_pair reads 128 * each block's sum of the
// quantized activations: `with_sums`.)
template <typename Tile>
torch::Tensor run_block_linear(const torch::Tensor& x, int64_t K, const c10::optional<torch::Tensor>& bias,
                               int64_t N, bool float_output, int64_t bytes_per_block, bool with_sums, Tile tile) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K] with the weight's K");
  auto parts = quantize_activation_blocks(x.stride(1) == 1 ? x : x.contiguous());
  Activations a{parts[0].data_ptr<int8_t>(), parts[1].data_ptr<float>(), parts[2].data_ptr<float>()};
  torch::Tensor sums128;
  if (with_sums && TIERGATE_BLOCK_AVX512 && (x.size(0) >= block_tiles::kRowTile || x.size(0) == 1)) {
    sums128 = (parts[0].view({x.size(0), K / kBlock, kBlock}).sum(-1, false, at::kInt) * 128).contiguous();
    a.sums128 = sums128.data_ptr<int32_t>();
  }
  auto b = float_bias(bias, N);
  const bool bf16 = x.scalar_type() == at::kBFloat16 && !float_output;
  auto result = torch::empty({x.size(0), N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  Output out{N, b.defined() ? b.data_ptr<float>() : nullptr};
  if (bf16)
    out.bf16 = result.data_ptr<at::BFloat16>();
  else
    out.f32 = result.data_ptr<float>();
  over_tiles(x.size(0), (N + 7) / 8, K / kBlock * bytes_per_block,
             [&](auto mt, int64_t m0, int64_t g0, int64_t g1) { tile(mt, a, m0, g0, g1, out); });
  return result;
}

}  // namespace

// x: [M, K] float32/bfloat16, K a multiple of 32. Returns (int8 [M, K], float32 scales [M, K/32],
// float32 scale * sum [M, K/32]): each block of 32 quantized to amax / 127.
std::vector<torch::Tensor> quantize_blocks_q8(torch::Tensor x) {
  return quantize_activation_blocks(x.stride(1) == 1 ? x : x.contiguous());
}

// x: [M, K]; packed: uint8 [ceil(N/8), K/32, 128] (q4_tile's layout); scales, mins: float32
// [ceil(N/8), K/32, 8]. Returns x W^T + bias as [M, N] in x's dtype (float32 with float_output),
// W = scale * q + min per block.
torch::Tensor q4_block_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, torch::Tensor mins,
                              c10::optional<torch::Tensor> bias, int64_t N, bool float_output) {
  const int64_t K = check_packed(packed, at::kByte, 128, N, scales);
  check_packed(packed, at::kByte, 128, N, mins);
  const uint8_t* wq = packed.data_ptr<uint8_t>();
  const float* wd = scales.data_ptr<float>();
  const float* wm = mins.data_ptr<float>();
  // A group's block: 128 bytes of nibbles, a scale and a min for each of its 8 columns.
  const int64_t bytes_per_block = 128 + 64;
  return run_block_linear(x, K, bias, N, float_output, bytes_per_block, false,
                          [&](auto mt, const Activations& a, int64_t m0, int64_t g0, int64_t g1, const Output& o) {
                            q4_tile<decltype(mt)::value>(wq, wd, wm, a, K, m0, g0, g1, o);
                          });
}

// x: [M, K]; packed: int8 [ceil(N/8), K/32, 256] (q8_tile's layout); scales: float32
// [ceil(N/8), K/32, 8]. Returns x W^T + bias as [M, N] in x's dtype (float32 with float_output),
// W = scale * q per block.
torch::Tensor q8_block_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales,
                              c10::optional<torch::Tensor> bias, int64_t N, bool float_output) {
  const int64_t K = check_packed(packed, at::kChar, 256, N, scales);
  const int8_t* wq = packed.data_ptr<int8_t>();
  const float* wd = scales.data_ptr<float>();
  const int64_t bytes_per_block = 256 + 32;
  const bool streamed = N * K > kStreamedWeightBytes;
  return run_block_linear(x, K, bias, N, float_output, bytes_per_block, true,
                          [&](auto mt, const Activations& a, int64_t m0, int64_t g0, int64_t g1, const Output& o) {
                            q8_tile<decltype(mt)::value>(wq, wd, a, K, m0, g0, g1, o, streamed);
                          });
}
