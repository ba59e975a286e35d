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

struct Activations {
  const int8_t* q;                  // [M, K]
  const float* d;                   // [M, K/32]
  const float* s;                   // [M, K/32]
  const uint8_t* offset = nullptr;  // [M, K]: q + 128, where a tile asks for it (q8_pair)
};

// Rows m0 .. m0 + MT of column group g (+ bias) into out [M, N]; the last group may be partial.
template <int MT>
void write_group(const float (*res)[8], const float* bias, float* out, int64_t N, int64_t m0, int64_t g) {
  const int64_t cols = std::min<int64_t>(8, N - g * 8);
  for (int t = 0; t < MT; ++t) {
    float* o = out + (m0 + t) * N + g * 8;
    for (int c = 0; c < cols; ++c) o[c] = bias ? res[t][c] + bias[g * 8 + c] : res[t][c];
  }
}

}  // namespace block_tiles
