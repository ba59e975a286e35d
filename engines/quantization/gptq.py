"""Error-compensating INT4 rounding (GPTQ, Frantar et al. 2022), written from the paper.

Columns (input channels) of W [N, K] are rounded one at a time; the output error each
rounding causes over the calibration inputs, ||x (w - q)^T||^2 with Hessian H = x^T x, is
compensated by updating the columns not yet rounded: with U the upper Cholesky factor of
H^-1, rounding column i moves the later columns j by -err_i * U[i, j] / U[i, i]. Updates are
applied lazily in blocks of columns (the within-block ones at once, the rest per block).

Group-wise (scale, zero) pairs are those of the storage format (int4.py: w = (q - 8) * scale
+ zero, one pair per group of consecutive input channels, stored in bf16): each group's pair
is computed from the updated weights when its first column is reached, optionally with an
activation-aware clip search on that group's block of H, and rounded to bf16 before the
weights are rounded against it, so the error GPTQ compensates is the one the op sees.
Act-order (columns by decreasing H diagonal) would split groups across the order, so group
pairs would come from the original weights; it is off by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DAMP = 0.01
BLOCK = 128
CLIP_RATIOS = [1.0 - 0.05 * i for i in range(10)]


def group_params(w: torch.Tensor, h_block: torch.Tensor | None = None,
                 ratios: list[float] = CLIP_RATIOS) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per row of one group w [N, g], as bf16-representable fp32. With the group's
    Hessian block, each row's range is shrunk by the ratio whose rounding gives the lowest
    output error (d H d^T); without it, the full min-max range."""
    lo, hi = w.amin(-1), w.amax(-1)
    best_err = torch.full(lo.shape, float("inf"))
    best_s, best_z = lo, lo
    for ratio in (ratios if h_block is not None else [1.0]):
        scale, zero = _params(lo * ratio, hi * ratio)
        if h_block is None:
            return scale, zero
        d = w - dequant(quant(w, scale, zero), scale, zero)
        err = ((d @ h_block) * d).sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s, best_z = torch.where(better, scale, best_s), torch.where(better, zero, best_z)
    return best_s, best_z


def _params(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = ((hi - lo) / 15.0).clamp_min(1e-8).to(torch.bfloat16).float()
    zero = (lo + 8.0 * scale).to(torch.bfloat16).float()
    return scale, zero


def quant(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Nearest level 0..15 of w [N, ...] for per-row (scale, zero) [N]."""
    shape = (-1,) + (1,) * (w.dim() - 1)
    return torch.round((w - zero.view(shape)) / scale.view(shape) + 8.0).clamp(0, 15)


def dequant(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    shape = (-1,) + (1,) * (q.dim() - 1)
    return (q - 8.0) * scale.view(shape) + zero.view(shape)


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, retrying with more damping."""
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    mean_diag = float(h.diagonal().mean())
    for factor in (1, 10, 100):
        try:
            lower = torch.linalg.cholesky(h + damp * factor * mean_diag * eye)
            return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)
        except torch.linalg.LinAlgError:
            continue
    raise RuntimeError("Hessian not positive definite even with 100x dampening")


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, gram: torch.Tensor, group: int, damp: float = DAMP,
                  clip: bool = True, act_order: bool = False):
    """GPTQ-round W [N, K] against H = gram [K, K]; K is padded to a multiple of `group` with
    zero columns (as Int4Linear does). Returns q int32 [N, Kp] in 0..15, scales and zeros
    [N, Kp/group] (fp32 values exact in bf16)."""
    w = weight.float()
    n, k = w.shape
    kp = k + (-k % group)
    w = F.pad(w, (0, kp - k))
    h = torch.zeros(kp, kp, dtype=torch.float64)
    h[:k, :k] = gram.double()
    dead = h.diagonal() <= 0   # padding and channels never active: any value works, keep them 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h_orig = h.float()
    groups = kp // group
    scales, zeros = torch.zeros(n, groups), torch.zeros(n, groups)

    def params_of(g: int, cols: torch.Tensor):
        sl = slice(g * group, (g + 1) * group)
        real = ~dead[sl]   # padded / dead columns do not stretch the range
        hb = h_orig[sl, sl][real][:, real] if clip else None
        scales[:, g], zeros[:, g] = group_params(cols[:, real] if real.any() else cols, hb)

    if act_order:   # static groups: pairs from the original weights
        for g in range(groups):
            params_of(g, w[:, g * group:(g + 1) * group])
        perm = torch.argsort(h.diagonal(), descending=True)
    else:
        perm = torch.arange(kp)
    w, h = w[:, perm], h[perm][:, perm]
    u = _inverse_cholesky(h, damp).float()
    q = torch.zeros(n, kp)
    block = max(BLOCK, group)
    for b0 in range(0, kp, block):
        b1 = min(b0 + block, kp)
        w1, err1, u1 = w[:, b0:b1].clone(), torch.zeros(n, b1 - b0), u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = int(perm[b0 + i])
            g = col // group
            if not act_order and col % group == 0:   # group start: pair from the updated weights
                params_of(g, w1[:, i:i + group])
            qi = quant(w1[:, i], scales[:, g], zeros[:, g])
            q[:, col] = qi
            e = (w1[:, i] - dequant(qi, scales[:, g], zeros[:, g])) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err1[:, i] = e
        w[:, b1:] -= err1 @ u[b0:b1, b1:]
    return q.to(torch.int32), scales, zeros
