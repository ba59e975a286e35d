// One decoder layer of a block-quantized model on the CPU in one call: the C++ ops the Python
// layer (engines/model/llama.py) dispatches one by one, called here in its order with its
// arguments, so the result is the same bit for bit. At batch 1 a layer's ~11 dispatches from
// Python cost about as much as its arithmetic. Compiled after the files that define those ops.

namespace {

// A block-quantized linear as engines/model/fused_decoder.py hands it: kind 4 takes
// {packed, scales, mins[, bias]} (q4_block_linear), kind 8 {packed, scales[, bias]} (q8).
torch::Tensor block_linear(const std::vector<torch::Tensor>& w, int64_t kind, int64_t n, const torch::Tensor& x) {
  if (kind == 4) {
    TORCH_CHECK(w.size() == 3 || w.size() == 4, "a Q4 block linear is packed, scales, mins[, bias]");
    c10::optional<torch::Tensor> bias = w.size() == 4 ? c10::optional<torch::Tensor>(w[3]) : c10::nullopt;
    return q4_block_linear(x, w[0], w[1], w[2], bias, n, false);
  }
  TORCH_CHECK(kind == 8 && (w.size() == 2 || w.size() == 3), "a Q8 block linear is packed, scales[, bias]");
  c10::optional<torch::Tensor> bias = w.size() == 3 ? c10::optional<torch::Tensor>(w[2]) : c10::nullopt;
  return q8_block_linear(x, w[0], w[1], bias, n, false);
}

}  // namespace

// hidden = input_layernorm(residual) [T, H]; residual [T, H] is updated in place. linears: qkv,
// o, gate_up, down (block_linear's form), with kinds and output widths; kv: {k_pool, v_pool} in
// the activations' dtype or {k_pool, v_pool, k_scale, v_scale} int8. Returns next_norm(residual).
torch::Tensor decoder_layer_blocks(torch::Tensor hidden, torch::Tensor residual, torch::Tensor cos, torch::Tensor sin,
                                   std::vector<std::vector<torch::Tensor>> linears, std::vector<int64_t> kinds,
                                   std::vector<int64_t> widths, torch::Tensor post_norm, torch::Tensor next_norm,
                                   double eps, int64_t Hq, int64_t Hkv, int64_t D, std::vector<torch::Tensor> kv,
                                   torch::Tensor slot_mapping, torch::Tensor block_tables, torch::Tensor seq_of_token,
                                   torch::Tensor context_lens, double scale) {
  TORCH_CHECK(linears.size() == 4 && kinds.size() == 4 && widths.size() == 4, "qkv, o, gate_up and down");
  TORCH_CHECK(kv.size() == 2 || kv.size() == 4, "kv is {k_pool, v_pool} or {k_pool, v_pool, k_scale, v_scale}");
  const int64_t T = hidden.size(0);
  auto qkv = rope_split_qkv(block_linear(linears[0], kinds[0], widths[0], hidden), cos, sin, Hq, Hkv, D);
  torch::Tensor attended;
  if (kv.size() == 2) {
    write_kv(qkv[1], qkv[2], kv[0], kv[1], slot_mapping);
    attended = paged_attention(qkv[0], kv[0], kv[1], block_tables, seq_of_token, context_lens, scale);
  } else {
    write_kv_int8(qkv[1], qkv[2], kv[0], kv[1], kv[2], kv[3], slot_mapping);
    attended = paged_attention_quantized(qkv[0], kv[0], kv[1], kv[2], kv[3], block_tables, seq_of_token,
                                         context_lens, scale);
  }
  auto projected = block_linear(linears[1], kinds[1], widths[1], attended.reshape({T, Hq * D}));
  auto normed = add_rms_norm(residual, projected, post_norm, eps);
  auto gate_up = block_linear(linears[2], kinds[2], widths[2], normed);
  auto down = block_linear(linears[3], kinds[3], widths[3], silu_mul(gate_up));
  return add_rms_norm(residual, down, next_norm, eps);
}
