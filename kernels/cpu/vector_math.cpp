// Scalar and 16-lane helpers shared by the CPU kernels (bf16 <-> fp32, vector exp).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

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

// 16 fp32 lanes (GCC/Clang vector extensions; AVX-512 with -march=native).
typedef float v16f __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f r;
  std::memcpy(&r, p, 64);
  return r;
}
inline v16f load16(const int8_t* p) {
  typedef int8_t v16b __attribute__((vector_size(16)));
  v16b b;
  std::memcpy(&b, p, 16);
  return __builtin_convertvector(b, v16f);
}
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

}  // namespace
