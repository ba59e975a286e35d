// Paged attention over quantized KV pools (int8, fp8 e4m3, int4), through the 16-lane kernel
// of attention_fp32.cpp; the pool's dtype names the format (int8, float8_e4m3fn, uint8 = int4).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

namespace {

template <typename QT, typename ST>
bool attention_quantized_dispatch(const QT* q, const ST* k, const ST* v, const at::Half* ks, const at::Half* vs,
                                  const int64_t* tables, const int64_t* seqs, const int64_t* lens, QT* out, int64_t B,
                                  int64_t Hq, int64_t Hkv, int64_t NB, int64_t D, int64_t max_blocks, float scale) {
  const int64_t G = Hq / Hkv;
#define TG_Q(DIM_, G_)                                                                                   \
  if (D == DIM_ && G == G_) {                                                                            \
    attention_kernel_v16<QT, ST, DIM_, G_>(q, k, v, ks, vs, tables, seqs, lens, out, B, Hq, Hkv, NB,     \
                                           max_blocks, scale);                                           \
    return true;                                                                                         \
  }
  TG_Q(64, 1) TG_Q(64, 2) TG_Q(64, 3) TG_Q(64, 4) TG_Q(64, 7) TG_Q(64, 8)
  TG_Q(128, 1) TG_Q(128, 2) TG_Q(128, 4) TG_Q(128, 8)
#undef TG_Q
  return false;
}

template <typename QT>
bool attention_quantized_for_query(torch::Tensor& q, torch::Tensor& k_pool, torch::Tensor& v_pool,
                                   torch::Tensor& k_scale, torch::Tensor& v_scale, torch::Tensor& tables,
                                   torch::Tensor& seqs, torch::Tensor& lens, torch::Tensor& out, float scale) {
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(0), NB = k_pool.size(1);
  const auto args = std::make_tuple(k_scale.data_ptr<at::Half>(), v_scale.data_ptr<at::Half>(),
                                    tables.data_ptr<int64_t>(), seqs.data_ptr<int64_t>(), lens.data_ptr<int64_t>());
  auto run = [&](auto* k, auto* v) {
    return attention_quantized_dispatch<QT>(q.data_ptr<QT>(), k, v, std::get<0>(args), std::get<1>(args),
                                            std::get<2>(args), std::get<3>(args), std::get<4>(args),
                                            out.data_ptr<QT>(), T, Hq, Hkv, NB, D, tables.size(1), scale);
  };
  switch (k_pool.scalar_type()) {
    case at::kChar:
      return run(k_pool.data_ptr<int8_t>(), v_pool.data_ptr<int8_t>());
    case at::kFloat8_e4m3fn:
      return run(static_cast<const Fp8E4M3*>(k_pool.data_ptr()), static_cast<const Fp8E4M3*>(v_pool.data_ptr()));
    case at::kByte:
      return run(static_cast<const Int4Pair*>(k_pool.data_ptr()), static_cast<const Int4Pair*>(v_pool.data_ptr()));
    default:
      return false;
  }
}

}  // namespace

// q: [T, Hq, D] float32/bf16; pools and scales as written by write_kv_int8 / write_kv_fp8 /
// write_kv_int4 (16-token blocks); the rest as paged_attention.
torch::Tensor paged_attention_quantized(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                                        torch::Tensor k_scale, torch::Tensor v_scale, torch::Tensor block_tables,
                                        torch::Tensor seq_of_token, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(k_pool.dim() == 5 && k_pool.size(3) == 16 && k_pool.is_contiguous() && v_pool.is_contiguous(),
              "a contiguous quantized pool with 16-token blocks");
  TORCH_CHECK(k_pool.scalar_type() == v_pool.scalar_type(), "K and V pools must share a dtype");
  TORCH_CHECK(k_scale.scalar_type() == at::kHalf && v_scale.scalar_type() == at::kHalf && k_scale.is_contiguous() &&
                  v_scale.is_contiguous(), "contiguous fp16 scales");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong &&
                  seq_of_token.scalar_type() == at::kLong, "int64 indices");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  seq_of_token = seq_of_token.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t packing = k_pool.scalar_type() == at::kByte ? 2 : 1;
  TORCH_CHECK(k_pool.size(2) * packing == q.size(2), "the pool's head size does not match q");
  auto out = torch::empty_like(q);
  bool done = false;
  if (q.scalar_type() == at::kFloat) {
    done = attention_quantized_for_query<float>(q, k_pool, v_pool, k_scale, v_scale, block_tables, seq_of_token,
                                                context_lens, out, scale);
  } else if (q.scalar_type() == at::kBFloat16) {
    done = attention_quantized_for_query<at::BFloat16>(q, k_pool, v_pool, k_scale, v_scale, block_tables, seq_of_token,
                                                       context_lens, out, scale);
  }
  TORCH_CHECK(done, "paged_attention_quantized: unsupported pool dtype / head size / grouping / query dtype");
  return out;
}
