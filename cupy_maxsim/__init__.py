"""cupy-maxsim: fused MaxSim (late-interaction) scoring for any DLPack array.

``import cupy_maxsim`` needs only NumPy: CuPy is imported when a GPU array arrives, and torch
and JAX only when their arrays do (or through ``cupy_maxsim.torch`` / ``cupy_maxsim.jax``).
"""

from . import tuning
from .index import Index
from .shards import ShardedIndex
from .quantize import pack, quantize_int8
from .scoring import score, score_candidates, score_packed, score_pairs
from .search import search, search_packed
from .training import score_backward

__version__ = "0.1.0"
__all__ = ["score", "score_pairs", "score_packed", "score_candidates", "search", "search_packed", "Index", "ShardedIndex", "score_backward", "pack", "quantize_int8",
           "tuning", "__version__"]
