"""Pick the implementation of each op for the device: Triton on CUDA (kernels issue),
the C++ CPU kernels where they compiled, else the torch reference."""

from __future__ import annotations

import torch

from kernels.cpu_extension import load_cpu_kernels
from kernels.reference import paged_attention_ref, write_kv_int8_ref, write_kv_ref
from kernels.triton.select import use_triton


class AttentionOps:
    """The paged-cache ops chosen once for a device."""

    def __init__(self, device: torch.device | str = "cpu", prefer_native: bool = True):
        device = torch.device(device)
        self.triton = _triton_attention_ops() if use_triton(device) else None
        self.native = load_cpu_kernels() if (prefer_native and device.type == "cpu" and not self.triton) else None
        self.name = "triton" if self.triton else "cpu-cpp" if self.native is not None else "torch-reference"

    def write_kv(self, k, v, k_pool, v_pool, slot_mapping, kv_scales=None) -> None:
        """kv_scales: (k_scale, v_scale) for an int8 pool, else None."""
        if self.triton:
            return self.triton.write_kv(k, v, k_pool, v_pool, slot_mapping, kv_scales)
        if kv_scales is not None:
            if self.native is not None:
                self.native.write_kv_int8(k, v, k_pool, v_pool, *kv_scales, slot_mapping)
            else:
                write_kv_int8_ref(k, v, k_pool, v_pool, *kv_scales, slot_mapping)
        elif self.native is not None:
            self.native.write_kv(k, v, k_pool, v_pool, slot_mapping)
        else:
            write_kv_ref(k, v, k_pool, v_pool, slot_mapping)

    def paged_attention(self, q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale: float,
                        kv_scales=None):
        if self.triton:
            return self.triton.paged_attention(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale,
                                               kv_scales)
        if self.native is not None:
            if kv_scales is None:
                return self.native.paged_attention(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale)
            if self._native_int8_ok(q, k_pool):
                return self.native.paged_attention_int8(q, k_pool, v_pool, *kv_scales, block_tables, seq_of_token,
                                                        context_lens, scale)
        return paged_attention_ref(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales)

    @staticmethod
    def _native_int8_ok(q, k_pool) -> bool:
        d, g = q.shape[-1], q.shape[1] // k_pool.shape[0]
        return k_pool.shape[3] == 16 and d in (64, 128) and g in (1, 2, 3, 4, 8) and not (d == 128 and g == 3)


def _triton_attention_ops():
    # Imported only once chosen: importing a kernel module fixes compile vs interpret.
    from kernels.triton.attention_ops import TritonAttentionOps

    return TritonAttentionOps()
