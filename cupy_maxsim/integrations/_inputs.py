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
