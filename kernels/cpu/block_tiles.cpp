// What the block-quantized linears' tiles share (block_tiles_avx512.cpp, block_linear.cpp): the
// block size, the quantized activations, the row tile and the write of a column group.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define TIERGATE_BLOCK_AVX512 1
#else
#define TIERGATE_BLOCK_AVX512 0
#endif

namespace block_tiles {

constexpr int64_t kBlock = 32;
// Activation rows sharing one decoded weight vector. AVX-512 has 32 vector registers, room for
// eight rows' sums; AVX2's 16 hold four.
constexpr int64_t kRowTile = TIERGATE_BLOCK_AVX512 ? 8 : 4;
// Row tiles that take the AVX-512 pair tiles: full tiles, and single rows, where the pair tile's
// unrolled blocks keep more independent chains in flight (decode step at batch 1, AMD EPYC Zen 4:
// 8.1 -> 7.7 ms); for 2-7 rows the one-group tiles measured faster (batch 4: 10.8 vs 11.6 ms).
template <int MT>
constexpr bool kPairTile = TIERGATE_BLOCK_AVX512 && (MT == kRowTile || MT == 1);

struct Activations {
  const int8_t* q;                  // [M, K]
  const float* d;                   // [M, K/32]
  const float* s;                   // [M, K/32]
  const int32_t* sums128 = nullptr; // [M, K/32]: 128 * each block's sum of q, where a tile asks for it (q8_pair)
};

// Where a linear's results go: [M, N] float32, or bfloat16 when the layer runs in bf16, written
// from the tile's fp32 sums so that no second pass over the output converts it; plus the bias.
struct Output {
  int64_t N;
  const float* bias = nullptr;         // [N] or none
  float* f32 = nullptr;                // one of the two
  c10::BFloat16* bf16 = nullptr;
};

// Rows m0 .. m0 + MT of column group g (+ bias) into out; the last group may be partial.
template <int MT>
void write_group(const float (*res)[8], const Output& out, int64_t m0, int64_t g) {
  const int64_t cols = std::min<int64_t>(8, out.N - g * 8);
  const float* bias = out.bias ? out.bias + g * 8 : nullptr;
  for (int t = 0; t < MT; ++t) {
    const int64_t at = (m0 + t) * out.N + g * 8;
    for (int c = 0; c < cols; ++c) {
      const float v = bias ? res[t][c] + bias[c] : res[t][c];
      if (out.bf16)
        out.bf16[at + c] = c10::BFloat16(v);
      else
        out.f32[at + c] = v;
    }
  }
}

}  // namespace block_tiles
