"""Pick the implementation of each op for the device: Triton on CUDA (kernels/triton),
the C++ CPU kernels where they compiled, else the torch reference."""

from __future__ import annotations

import torch

from kernels.cpu_extension import load_cpu_kernels
from kernels.reference import (
    paged_attention_ref,
    write_kv_fp8_ref,
    write_kv_int4_ref,
    write_kv_int8_ref,
    write_kv_ref,
)
from kernels.triton.select import use_triton

# Quantized pools are told apart by their storage dtype: int8, fp8 e4m3, int4 (two per uint8).
_QUANTIZED_WRITES = {
    torch.int8: ("write_kv_int8", write_kv_int8_ref),
    torch.float8_e4m3fn: ("write_kv_fp8", write_kv_fp8_ref),
    torch.uint8: ("write_kv_int4", write_kv_int4_ref),
}


class AttentionOps:
    """The paged-cache ops chosen once for a device."""

    def __init__(self, device: torch.device | str = "cpu", prefer_native: bool = True):
        device = torch.device(device)
        self.triton = _triton_attention_ops() if use_triton(device) else None
        self.native = load_cpu_kernels() if (prefer_native and device.type == "cpu" and not self.triton) else None
        self.name = "triton" if self.triton else "cpu-cpp" if self.native is not None else "torch-reference"

    def begin_step(self, seq_of_token: torch.Tensor, seq_of_token_host: list[int] | None = None) -> None:
        """A new step: its seq_of_token, and the same list on the host where the caller has it
        (the Triton extend kernel plans its tiles from it, without a device->host sync)."""
        if self.triton:
            self.triton.begin_step(seq_of_token, seq_of_token_host)

    def write_kv(self, k, v, k_pool, v_pool, slot_mapping, kv_scales=None) -> None:
        """kv_scales: (k_scale, v_scale) for a quantized pool (int8, fp8, int4), else None."""
        # The Triton kernels have no int4 pool: it takes the torch reference, on any device (on
        # CUDA a few host syncs per layer: a known slow path, INT4 KV is meant for the CPU draft).
        if self.triton and k_pool.dtype != torch.uint8:
            return self.triton.write_kv(k, v, k_pool, v_pool, slot_mapping, kv_scales)
        if kv_scales is not None:
            native_name, reference = _QUANTIZED_WRITES[k_pool.dtype]
            op = getattr(self.native, native_name) if self.native is not None else reference
            op(k, v, k_pool, v_pool, *kv_scales, slot_mapping)
        elif self.native is not None:
            self.native.write_kv(k, v, k_pool, v_pool, slot_mapping)
        else:
            write_kv_ref(k, v, k_pool, v_pool, slot_mapping)

    def paged_attention(self, q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale: float,
                        kv_scales=None):
        if self.triton and k_pool.dtype != torch.uint8:
            return self.triton.paged_attention(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale,
                                               kv_scales)
        if self.native is not None:
            if kv_scales is None:
                return self.native.paged_attention(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale)
            if self._native_quantized_ok(q, k_pool):
                return self.native.paged_attention_quantized(q, k_pool, v_pool, *kv_scales, block_tables,
                                                             seq_of_token, context_lens, scale)
        return paged_attention_ref(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales)

    @staticmethod
    def _native_quantized_ok(q, k_pool) -> bool:
        return AttentionOps.native_quantized_shape_ok(q.shape[-1], q.shape[1] // k_pool.shape[0], k_pool.shape[3],
                                                      q.dtype)

    @staticmethod
    def native_quantized_shape_ok(head_dim: int, group: int, block_size: int, dtype: torch.dtype) -> bool:
        """The shapes the 16-lane C++ kernel for quantized pools is instantiated for (others use
        the reference): head dim, query heads per KV head, tokens per block, activation dtype."""
        d, g = head_dim, group
        return (block_size == 16 and dtype in (torch.float32, torch.bfloat16) and d in (64, 128)
                and (g in (1, 2, 3, 4, 8) or (d, g) == (64, 7)) and not (d == 128 and g == 3))  # 7: Qwen2.5 14/2 heads


def _triton_attention_ops():
    # Imported only once chosen: importing a kernel module fixes compile vs interpret.
    from kernels.triton.attention_ops import TritonAttentionOps

    return TritonAttentionOps()
