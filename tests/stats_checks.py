"""Statistical checks shared by the tests of sampling and speculative decoding."""

from __future__ import annotations

import torch


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson goodness of fit; cells expected below `min_expected` are pooled into one."""
    counts, probs = counts.double(), probs.double()
    expected = probs / probs.sum() * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
