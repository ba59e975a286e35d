// Scalar and 16-lane helpers shared by the CPU kernels (bf16 <-> fp32, fp8 and int4 -> fp32,
// vector exp), and the storage types of quantized KV pools.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t bf16_bits) {
  const uint32_t wide = static_cast<uint32_t>(bf16_bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

inline void store_out(float* p, int64_t i, float v) { p[i] = v; }
inline void store_out(at::BFloat16* p, int64_t i, float v) { p[i] = at::BFloat16(v); }

// 16 fp32 lanes: one AVX-512 register through GCC/Clang vector extensions, or on AVX2-only CPUs
// a pair of 8-lane registers. GCC lowers a 64-byte generic vector on AVX2 through the stack (a
// store and a reload around most operations, ~10x slower attention), so there it is a struct of
// two __m256 with the operators the kernels use.
#if defined(__AVX2__) && !defined(__AVX512F__)
struct v16f {
  __m256 lo, hi;
  float operator[](int i) const {
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, lo);
    _mm256_store_ps(tmp + 8, hi);
    return tmp[i];
  }
};
inline v16f operator+(v16f a, v16f b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline v16f operator-(v16f a, v16f b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline v16f operator*(v16f a, v16f b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline v16f splat16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline v16f operator*(float a, v16f b) { return splat16(a) * b; }
inline v16f operator*(v16f a, float b) { return a * splat16(b); }
inline v16f operator-(v16f a, float b) { return a - splat16(b); }
inline v16f operator+(v16f a, float b) { return a + splat16(b); }
inline v16f& operator+=(v16f& a, float b) { return a = a + b; }
inline v16f& operator+=(v16f& a, v16f b) { return a = a + b; }
inline v16f& operator*=(v16f& a, v16f b) { return a = a * b; }
inline v16f& operator*=(v16f& a, float b) { return a = a * b; }

inline v16f load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
#else
typedef float v16f __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f r;
  std::memcpy(&r, p, 64);
  return r;
}
#endif
// FP8 e4m3fn storage (bias 7, no infinities, 0x7F/0xFF NaN, never written by our kernels).
struct Fp8E4M3 {
  uint8_t bits;
};

// Two 4-bit values 0..15 in one byte of an INT4 KV pool: head dim j in the low nibble and
// head dim j + D/2 in the high one, so 16 bytes unpack into two whole 16-lane vectors.
struct Int4Pair {
  uint8_t bits;
};

// e4m3 -> fp32 times 2^-8, exact: the sign and the 7 exponent/mantissa bits, shifted into an
// fp16 (bias 15), are the e4m3 value scaled by 2^(7-15); subnormals map to fp16 subnormals,
// which the fp16 -> fp32 conversion turns into normal floats. Callers fold the 2^8 into the
// per-token or per-channel scale (kFp8Unit) instead of multiplying every element.
constexpr float kFp8Unit = 256.f;
inline float fp8_to_f32(uint8_t b) {
  const uint16_t bits = static_cast<uint16_t>(((b & 0x80) << 8) | ((b & 0x7F) << 7));
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h) * kFp8Unit;
}

// Byte -> 16-lane conversions. GCC's generic vector conversions from bytes come out scalar,
// so AVX-512 builds use intrinsics (fp8: vpmovzxbw, two masks and shifts, vcvtph2ps).
#if defined(__AVX512F__)
inline v16f as_v16f(__m512 x) {
  v16f r;
  std::memcpy(&r, &x, 64);
  return r;
}
inline v16f load16(const int8_t* p) {
  return as_v16f(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
}
inline v16f load16(const Fp8E4M3* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                       _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
  return as_v16f(_mm512_cvtph_ps(bits));
}
// 16 bytes of an INT4 pool -> the low nibbles and the high nibbles as 16 fp32 lanes each.
inline void load16_nibbles(const Int4Pair* p, v16f& lo, v16f& hi) {
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = as_v16f(_mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15))));
  hi = as_v16f(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4)));
}
#elif defined(__AVX2__)
inline __m256 bytes8_to_ps(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline v16f load16(const int8_t* p) { return {bytes8_to_ps(p), bytes8_to_ps(p + 8)}; }
inline v16f load16(const Fp8E4M3* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                       _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(bits)), _mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1))};
}
inline void load16_nibbles(const Int4Pair* p, v16f& lo, v16f& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i w0 = _mm256_cvtepu8_epi32(raw), w1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
  const __m256i m = _mm256_set1_epi32(15);
  lo = {_mm256_cvtepi32_ps(_mm256_and_si256(w0, m)), _mm256_cvtepi32_ps(_mm256_and_si256(w1, m))};
  hi = {_mm256_cvtepi32_ps(_mm256_srli_epi32(w0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(w1, 4))};
}
#else
inline v16f load16(const int8_t* p) {
  v16f r;
  for (int i = 0; i < 16; ++i) r[i] = static_cast<float>(p[i]);
  return r;
}
inline v16f load16(const Fp8E4M3* p) {
  v16f r;
  for (int i = 0; i < 16; ++i) r[i] = fp8_to_f32(p[i].bits) / kFp8Unit;
  return r;
}
inline void load16_nibbles(const Int4Pair* p, v16f& lo, v16f& hi) {
  for (int i = 0; i < 16; ++i) {
    lo[i] = static_cast<float>(p[i].bits & 15);
    hi[i] = static_cast<float>(p[i].bits >> 4);
  }
}
#endif

inline v16f load16(const uint16_t* p) {
  typedef uint16_t v16h __attribute__((vector_size(32)));
  typedef uint32_t v16u __attribute__((vector_size(64)));
  v16h h;
  std::memcpy(&h, p, 32);
  v16u w = __builtin_convertvector(h, v16u) << 16;
  v16f r;
  std::memcpy(&r, &w, 64);
  return r;
}

// exp on 16 lanes: 2^(x log2 e) split into 2^n * 2^f, with a degree-6 polynomial for
// 2^f on [-0.5, 0.5] (relative error ~2e-7, below bf16 and fp32 softmax noise).
#if defined(__AVX2__) && !defined(__AVX512F__)
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 half = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(-0.5f), t);   // sign of t
  const __m256i ni = _mm256_cvttps_epi32(_mm256_add_ps(t, half));
  const __m256 f = _mm256_sub_ps(t, _mm256_cvtepi32_ps(ni));
  __m256 poly = _mm256_set1_ps(1.5403530393381606e-4f);
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.3333558146428443e-3f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(9.6181291076284772e-3f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(5.5504108664821580e-2f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(2.4022650695910071e-1f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(6.9314718055994531e-1f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.0f));
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(poly), _mm256_slli_epi32(ni, 23)));
}
inline v16f exp16(v16f x) { return {exp8(x.lo), exp8(x.hi)}; }
#else
inline v16f exp16(v16f x) {
  typedef int32_t v16i __attribute__((vector_size(64)));
  const v16f lo = v16f{} - 87.0f, hi = v16f{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v16f t = x * 1.44269504088896341f;
  const v16f n = __builtin_convertvector(__builtin_convertvector(t + (t < 0 ? -0.5f : 0.5f), v16i), v16f);
  const v16f f = t - n;
  v16f poly = v16f{} + 1.5403530393381606e-4f;
  poly = poly * f + 1.3333558146428443e-3f;
  poly = poly * f + 9.6181291076284772e-3f;
  poly = poly * f + 5.5504108664821580e-2f;
  poly = poly * f + 2.4022650695910071e-1f;
  poly = poly * f + 6.9314718055994531e-1f;
  poly = poly * f + 1.0f;
  v16i bits;
  std::memcpy(&bits, &poly, 64);
  bits += __builtin_convertvector(n, v16i) << 23;
  v16f r;
  std::memcpy(&r, &bits, 64);
  return r;
}
#endif

}  // namespace
