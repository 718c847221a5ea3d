"""The tools' inputs as torch tensors: what every integration accepts besides tensors."""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(x) -> torch.Tensor:
    """Tensors as they are; NumPy arrays without a copy; lists of either stacked."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float, bool)):
        return torch.stack([as_tensor(item) for item in x])
    return torch.as_tensor(x)


def bool_mask(mask):
    """A bool mask, or None: 0/1 float masks (the tools' other form) as ``mask != 0``."""
    if mask is None:
        return None
    mask = as_tensor(mask)
    return mask if mask.dtype == torch.bool else mask != 0


def padded(items, masks=None):
    """A list of (L_i, H) items as one zero-padded (N, L, H) tensor and its bool mask (True: a
    real row; with ``masks``, each item's own 1-D mask over its rows)."""
    items = [as_tensor(item) for item in items]
    longest = max((item.shape[0] for item in items), default=0)
    out = items[0].new_zeros((len(items), longest, items[0].shape[-1])) if items else torch.zeros((0, 0, 0))
    real = torch.zeros((len(items), longest), dtype=torch.bool, device=out.device)
    for n, item in enumerate(items):
        out[n, :item.shape[0]] = item
        real[n, :item.shape[0]] = True if masks is None else bool_mask(masks[n]).to(out.device)
    return out, real
