"""The cases bench/gpu_check.py runs: each builds its inputs at a real model's size, runs a
Triton kernel and its torch reference, and says how many bytes and FLOPs one call moves.

Shapes: SmolLM2-135M (9/3 heads, head dim 64, hidden 576, FFN 1536) and a Llama-3-8B-like
decoder (32/8 heads, head dim 128, hidden 4096, FFN 14336). `small=True` shrinks every case
for the CPU smoke run under the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels.reference import paged_attention_ref, write_kv_int8_ref, write_kv_ref
from kernels.reference_gemm import fp8_linear_ref, w4a16_linear_ref, w8a16_linear_ref
from kernels.reference_rope import apply_rope_ref
from kernels.triton._common import num_sms
from kernels.triton.attention_ops import TritonAttentionOps
from kernels.triton.decode_attention import paged_decode_attention
from kernels.triton.elementwise import add_rms_norm_triton, apply_rope_triton, silu_mul_triton
from kernels.triton.extend_attention import paged_extend_attention
from kernels.triton.gemm_common import plan_gemm
from kernels.triton.gemm_fp8 import fp8_linear
from kernels.triton.gemm_weight_only import w4a16_linear, w8a16_linear
from kernels.triton.store_kv import write_kv_quantized_triton, write_kv_triton

MODELS = {
    "smollm2": {"hidden": 576, "inter": 1536, "hq": 9, "hkv": 3, "d": 64},
    "llama8b": {"hidden": 4096, "inter": 14336, "hq": 32, "hkv": 8, "d": 128},
}
BS = 16
KV_DTYPES = {"bf16": torch.bfloat16, "int8": torch.int8, "fp8": torch.float8_e4m3fn}
# bf16: bit-exact; int8: codes within one step (a tie may round the other way), scales exact;
# fp8: relative error of the value read back (3 mantissa bits)
STORE_TOL = {"bf16": 0.0, "int8": 1.0, "fp8": 1 / 16}


@dataclass
class Case:
    kernel: str                      # family: store_kv, decode_attention, ...
    name: str                        # the case, with its shape
    run: Callable[[], object]        # the Triton op as dispatched (timed)
    check: Callable[[], float]       # normalized error vs the reference (runs once)
    tol: float
    bytes: int = 0
    flops: int = 0
    baseline: Callable[[], object] | None = None   # bf16 torch op of the same shape (GEMMs)
    info: dict = field(default_factory=dict)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|: scale-free, so one tolerance fits every shape."""
    want = want.float().cpu() if got.device != want.device else want.float()
    return ((got.float().to(want.device) - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _pool(kv: torch.dtype, hkv: int, blocks: int, d: int, device, g: torch.Generator):
    p = 2 if kv == torch.bfloat16 else 1
    ks, vs = (hkv, blocks, d // p, BS, p), (hkv, blocks, BS // p, d, p)
    if kv == torch.int8:
        k, v = (torch.randint(-127, 128, s, generator=g, dtype=torch.int8) for s in (ks, vs))
    elif kv == torch.float8_e4m3fn:
        k, v = ((torch.randn(s, generator=g) * 100).clamp(-448, 448).to(kv) for s in (ks, vs))
    else:
        k, v = (torch.randn(s, generator=g).to(kv) for s in (ks, vs))
    scales = None
    if kv != torch.bfloat16:
        top = 1 / 127 if kv == torch.int8 else 1 / 448
        scales = tuple(((torch.rand(hkv, blocks, BS, generator=g) + 0.5) * 2 * top).half().to(device) for _ in "kv")
    return k.to(device), v.to(device), scales


def _kv_bytes(tokens: int, m: dict, kv: torch.dtype) -> int:
    elem = torch.empty((), dtype=kv).element_size()
    return tokens * m["hkv"] * (2 * m["d"] * elem + (4 if kv != torch.bfloat16 else 0))


def store_cases(device, small: bool) -> list[Case]:
    out = []
    for model, m in MODELS.items():
        t = 64 if small else 4096
        for kv_name, kv in KV_DTYPES.items():
            g = torch.Generator().manual_seed(1)
            blocks = 2 * t // BS
            k_pool, v_pool, scales = _pool(kv, m["hkv"], blocks, m["d"], device, g)
            k, v = (torch.randn(t, m["hkv"], m["d"], generator=g).to(torch.bfloat16).to(device) for _ in "kv")
            slots = torch.randperm(blocks * BS, generator=g)[:t].to(device)
            args = (k, v, k_pool, v_pool) + (tuple(scales) if scales else ()) + (slots,)
            op = write_kv_triton if scales is None else write_kv_quantized_triton
            out.append(Case("store_kv", f"{model} T={t} kv={kv_name}", lambda op=op, a=args: op(*a),
                            _store_check(op, args, kv), STORE_TOL[kv_name],
                            bytes=t * m["hkv"] * m["d"] * 2 * 2 + _kv_bytes(t, m, kv)))
    return out


def _store_check(op, args, kv):
    def check() -> float:
        ours = [a.clone() for a in args[2:-1]]
        op(*args[:2], *ours, args[-1])
        if kv == torch.float8_e4m3fn:       # relative error of what attention will read back
            from kernels.reference import gather_kv
            blocks = torch.arange(ours[0].shape[1], device=ours[0].device)
            keys, _ = gather_kv(ours[0], ours[1], blocks, (ours[2], ours[3]))
            got = keys[:, args[-1]].transpose(0, 1)
            return ((got - args[0].float()).abs() / args[0].float().abs().clamp_min(1e-2)).max().item()
        ref = [a.clone() for a in args[2:-1]]
        (write_kv_ref if kv == torch.bfloat16 else write_kv_int8_ref)(*args[:2], *ref, args[-1])
        diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(ours, ref, strict=True)]
        if kv == torch.int8 and max(diffs[2:]) > 0:
            return float("inf")                  # scales must be exact
        return max(diffs[:2])
    return check


def _paged_step(m, kv, lens_new, cached, device, g):
    """Sequences with `cached` positions already in the pool and lens_new[i] new tokens."""
    widths = [-(-(c + n) // BS) for c, n in zip(cached, lens_new, strict=True)]
    blocks = sum(widths) + 1
    k, v, scales = _pool(kv, m["hkv"], blocks, m["d"], device, g)
    perm = torch.randperm(blocks, generator=g)
    tables = torch.zeros(len(widths), max(widths), dtype=torch.long)
    start = 0
    for i, w in enumerate(widths):
        tables[i, :w] = perm[start:start + w]
        start += w
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lens_new)])
    ctx = torch.cat([torch.arange(c + 1, c + n + 1) for c, n in zip(cached, lens_new, strict=True)])
    q = (torch.randn(len(seq), m["hq"], m["d"], generator=g) * 2).to(torch.bfloat16)
    on = lambda x: x.to(device)
    return on(q), k, v, on(tables), on(seq), on(ctx), scales


def attention_cases(device, small: bool) -> list[Case]:
    out = []
    decode = [("llama8b", 32, 2048), ("llama8b", 1, 8192), ("smollm2", 64, 1024)]
    extend = [("llama8b", 4, 1024, 1024), ("smollm2", 8, 512, 0)]
    if small:
        decode, extend = [("smollm2", 3, 100), ("llama8b", 1, 300)], [("smollm2", 2, 40, 30)]
    for model, batch, ctx in decode:
        m = MODELS[model]
        for kv_name, kv in KV_DTYPES.items():
            if model == "smollm2" and kv_name != "bf16" and not small:
                continue
            g = torch.Generator().manual_seed(2)
            step = _paged_step(m, kv, [1] * batch, [ctx - 1] * batch, device, g)
            args = step[:6] + (m["d"] ** -0.5, step[6])
            out.append(Case("decode_attention", f"{model} B={batch} ctx={ctx} kv={kv_name}",
                            lambda a=args: paged_decode_attention(*a), _attn_check(paged_decode_attention, args),
                            2e-2, bytes=_kv_bytes(batch * ctx, m, kv) + 2 * batch * m["hq"] * m["d"] * 2,
                            flops=4 * batch * ctx * m["hq"] * m["d"]))
    for model, seqs, new, cached in extend:
        m = MODELS[model]
        for kv_name in ("bf16", "int8"):
            kv = KV_DTYPES[kv_name]
            g = torch.Generator().manual_seed(3)
            step = _paged_step(m, kv, [new] * seqs, [cached] * seqs, device, g)
            args = step[:6] + (m["d"] ** -0.5, step[6])
            ops = TritonAttentionOps()                   # tiles built once, as per step in the engine
            ctx_sum = int(step[5].sum())
            out.append(Case("extend_attention", f"{model} {seqs}x{new} new over {cached} kv={kv_name}",
                            lambda a=args, o=ops: o.paged_attention(*a), _attn_check(paged_extend_attention, args),
                            2e-2, bytes=_kv_bytes(seqs * (new + cached), m, kv) + 2 * seqs * new * m["hq"] * m["d"] * 2,
                            flops=4 * ctx_sum * m["hq"] * m["d"]))
    return out


def _attn_check(op, args):
    def check() -> float:
        got = op(*args)
        cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args[:6]] + [args[6]]
        scales = tuple(s.cpu() for s in args[7]) if args[7] else None
        # The reference runs on the CPU (it builds index tensors there), in fp32 for a clean baseline.
        return _rel_err(got.cpu(), paged_attention_ref(cpu[0].float(), *cpu[1:], scales))
    return check


def _gemm_shapes(m: dict) -> list[tuple[int, int]]:
    """(N, K) of the decoder's GEMMs: fused qkv, fused gate_up, down."""
    return [(m["hidden"] + 2 * m["hkv"] * m["d"], m["hidden"]), (2 * m["inter"], m["hidden"]), (m["hidden"], m["inter"])]


def gemm_cases(device, small: bool) -> list[Case]:
    out = []
    for model, m in MODELS.items():
        shapes = [(96, 64), (160, 128)] if small else _gemm_shapes(m)
        rows = (1, 5) if small else ((1, 16, 512) if model == "llama8b" else (1, 16))
        for n, k in shapes:
            g = torch.Generator().manual_seed(4)
            w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device)
            group = 32 if small else 128
            groups = -(-k // group)            # INT4 weights are padded to whole groups (SmolLM2: 576 -> 640)
            q4 = torch.randint(0, 256, (n, groups * group // 2), generator=g, dtype=torch.uint8).to(device)
            s4 = (torch.rand(n, groups, generator=g) * 0.01 + 0.005).to(device)
            z4 = (torch.randn(n, groups, generator=g) * 0.01).to(device)
            w4_bytes = q4.numel() + 8 * s4.numel()
            q8 = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(device)
            s8 = (w.abs().amax(1) / 127).to(torch.bfloat16)
            f8_scale = (w.abs().amax(1) / 448).float()
            f8 = (w / f8_scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
            w16 = w.to(torch.bfloat16)
            for mm in rows:
                x = torch.randn(mm, k, generator=g).to(torch.bfloat16).to(device)
                base = lambda x=x, w16=w16: F.linear(x, w16)
                act = 2 * mm * (k + n)
                for kernel, run, ref, wbytes in (
                    ("w4a16", lambda x=x, a=(q4, s4, z4, group): w4a16_linear(x, *a),
                     lambda x=x, a=(q4, s4, z4, group): w4a16_linear_ref(x, *a), w4_bytes),
                    ("w8a16", lambda x=x, a=(q8, s8): w8a16_linear(x, *a),
                     lambda x=x, a=(q8, s8): w8a16_linear_ref(x, *a), n * k + 2 * n),
                    ("fp8", lambda x=x, a=(f8, f8_scale): fp8_linear(x, *a),
                     lambda x=x, a=(f8, f8_scale): fp8_linear_ref(x, *a), n * k + 4 * n),
                ):
                    out.append(Case(f"gemm_{kernel}", f"{model} M={mm} N={n} K={k}", run,
                                    lambda r=run, f=ref: _rel_err(r(), f()), 1e-2, bytes=wbytes + act,
                                    flops=2 * mm * n * k, baseline=base, info={"model": model, "M": mm}))
                if mm == 1:     # the tensor-core tiles the GEMV replaced at batch 1, for comparison
                    tiles = plan_gemm(1, n, k, group, num_sms(x.device))
                    run = lambda x=x, a=(q4, s4, z4, group), p=tiles: w4a16_linear(x, *a, plan=p)
                    out.append(Case("gemm_w4a16_tiles", f"{model} M=1 N={n} K={k}", run,
                                    lambda r=run, a=(q4, s4, z4, group), x=x: _rel_err(r(), w4a16_linear_ref(x, *a)),
                                    1e-2, bytes=w4_bytes + 2 * (k + n), flops=2 * n * k,
                                    baseline=base, info={"model": model, "M": 1}))
    return out


def elementwise_cases(device, small: bool) -> list[Case]:
    out = []
    for model, m in MODELS.items():
        t = 48 if small else 4096
        g = torch.Generator().manual_seed(5)
        h, inter, heads = m["hidden"], m["inter"], m["hq"] + m["hkv"]
        res = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
        delta = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
        weight = (torch.rand(h, generator=g) + 0.5).to(device)
        scratch = res.clone()                 # timed in place: the residual keeps growing, harmlessly
        out.append(Case("add_rms_norm", f"{model} T={t} H={h}",
                        lambda a=(scratch, delta, weight): add_rms_norm_triton(*a, 1e-5),
                        lambda a=(res, delta, weight): _norm_err(*a), 1e-2, bytes=4 * t * h * 2))
        gate_up = torch.randn(t, 2 * inter, generator=g).to(torch.bfloat16).to(device)
        out.append(Case("silu_mul", f"{model} T={t} I={inter}", lambda gu=gate_up: silu_mul_triton(gu),
                        lambda gu=gate_up, i=inter: _rel_err(silu_mul_triton(gu),
                                                             F.silu(gu.float()[:, :i]) * gu.float()[:, i:]),
                        1e-2, bytes=3 * t * inter * 2))
        x = torch.randn(t, heads, m["d"], generator=g).to(torch.bfloat16).to(device)
        ang = torch.rand(t, 1, m["d"] // 2, generator=g) * 6.28
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.bfloat16).to(device)
        sin = torch.cat([-ang.sin(), ang.sin()], -1).to(torch.bfloat16).to(device)
        out.append(Case("rope", f"{model} T={t} heads={heads}", lambda x=x, c=cos, s=sin: apply_rope_triton(x, c, s),
                        lambda x=x, c=cos, s=sin: _rel_err(apply_rope_triton(x, c, s),
                                                           apply_rope_ref(x.float(), c.float(), s.float())),
                        1e-2, bytes=2 * t * heads * m["d"] * 2))
    return out


def _norm_err(res, delta, weight) -> float:
    from kernels.reference import add_rms_norm_ref
    ours, ref = res.clone(), res.clone()
    got = add_rms_norm_triton(ours, delta, weight, 1e-5)
    want = add_rms_norm_ref(ref, delta, weight, 1e-5)
    if not torch.equal(ours, ref):
        return float("inf")                  # the in-place residual update must be exact
    return _rel_err(got, want)


def all_cases(device, small: bool) -> list[Case]:
    return (store_cases(device, small) + attention_cases(device, small) + gemm_cases(device, small)
            + elementwise_cases(device, small))
