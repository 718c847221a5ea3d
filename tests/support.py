"""Shared test helpers: comparison under the MaxSim semantics, input generators."""

from __future__ import annotations

import contextlib
import types

import numpy as np


def gpu_available() -> bool:
    """CuPy imports and a CUDA device is there (the GPU tests' marker: conftest)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def to_numpy(x) -> np.ndarray:
    """Any result (NumPy, CuPy, torch, JAX) as a host float64 array."""
    if hasattr(x, "get"):
        x = x.get()
    elif type(x).__module__.startswith("torch"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def answer_arrays(answer) -> list:
    """A scoring call's answer (scores, or scores and winners) as a list of float64 host arrays."""
    return [to_numpy(x) for x in (answer if isinstance(answer, tuple) else (answer,))]


def assert_scores_match(actual, expected, atol: float, rtol: float = 0.0) -> None:
    """Equal infinities and NaNs at the same places; finite values within tolerance."""
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected), err_msg="+inf positions differ")
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg="-inf positions differ")
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], atol=atol, rtol=rtol)


def assert_flash_attention_rule(ours, theirs, exact, noise: float = 1e-5, where=None, what: str = "") -> None:
    """The FlashAttention rule for a package's computation with our scorer (``ours``) against the
    same with its own (``theirs``), both in the same low input precision, and ``exact`` (its own
    scorer in float64 on the same rounded inputs): our largest error at most twice theirs, plus
    ``noise`` times the exact values' scale (float32 accumulation). ``where``: the elements
    compared (default all)."""
    ours, theirs, exact = to_numpy(ours), to_numpy(theirs), to_numpy(exact)
    if where is not None:
        where = to_numpy(where).astype(bool)
        ours, theirs, exact = ours[where], theirs[where], exact[where]
    if exact.size == 0:
        return
    scale = max(float(np.abs(exact).max()), 1.0)
    error, their_error = float(np.abs(ours - exact).max()), float(np.abs(theirs - exact).max())
    assert error <= 2 * their_error + noise * scale, (
        f"{what}: error {error:.3g} against float64, the package's own scorer's {their_error:.3g} (scale {scale:.3g})")


def cast_scorer(scorer, dtype, compute=None):
    """``scorer`` (an integration's signature: embeddings first, then anything) on the embeddings
    rounded to ``dtype`` and computed in ``compute`` (the float64 reference on the same rounded
    inputs), its scores back in float32: how a float16 / bfloat16 training step hands them over."""
    def scored(queries_embeddings, documents_embeddings, *args, **kwargs):
        q, d = queries_embeddings.to(dtype), documents_embeddings.to(dtype)
        if compute is not None:
            q, d = q.to(compute), d.to(compute)
        return scorer(q, d, *args, **kwargs).float()
    return scored


def features_on(device, features):
    """Tokenised features (dicts) on a model's device, as a trainer's batch_to_device puts them."""
    import torch

    return [{key: value.to(device) if torch.is_tensor(value) else value for key, value in feature.items()}
            for feature in features]


#: The tiny BERT's words (texts() draws from them).
WORDS = [f"w{i}" for i in range(40)]


def save_tiny_bert(folder, words=WORDS, bias: float = 0.0):
    """A real BERT for the integrations' models (PyLate's ColBERT, sentence-transformers'
    MultiVectorEncoder): one layer of random weights and a word-level vocabulary (``words`` and
    punctuation, the skiplists' holes), saved in ``folder`` (no download); ``folder``."""
    import torch
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(words) + list(".,!?;:")
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    try:  # transformers 5 builds the word piece model from the dict (vocab_file= gives all [UNK] there)
        tokenizer = transformers.BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)})
    except TypeError:  # transformers 4
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    assert tokenizer.tokenize("w1 w2,") == ["w1", "w2", ","], tokenizer.tokenize("w1 w2,")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    bert = transformers.BertModel(config)
    with torch.no_grad():  # words, not positions, make the embeddings (scores differ by document)
        bert.embeddings.word_embeddings.weight.normal_(0.0, 1.0)
        bert.encoder.layer[-1].output.LayerNorm.bias.fill_(bias)
    bert.save_pretrained(folder)
    return folder


def texts(rng, count, words):
    """``count`` texts of ``words`` words with punctuation inside (the skiplist's holes)."""
    return [" ".join(str(rng.choice(WORDS)) + ("," if rng.random() < 0.3 else "") for _ in range(words))
            for _ in range(count)]


def unit_rows(rng, shape, dtype=np.float32) -> np.ndarray:
    """Random unit-norm token vectors (the embeddings MaxSim models produce)."""
    x = rng.standard_normal(shape)
    x /= np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return x.astype(dtype)


def holey_mask(rng, shape, keep=0.7) -> np.ndarray:
    """A boolean mask with holes (not a prefix), one all-False row when there are 3+ rows."""
    mask = rng.random(shape) < keep
    if mask.ndim == 2 and mask.shape[0] >= 3:
        mask[1] = False
    return mask


def masked_gpu_corpus(rng, dtype: str, nq: int, lq: int, nd: int, length: int, dim: int):
    """A GPU problem of padded documents with holes in their masks, a NaN in document 5's real
    token 3 and document 7 empty: (q, d, mask, extra score arguments, q and d as float64 of what
    the kernels read, the mask on the host). ``dtype`` float16, bfloat16 (torch tensors), float32
    or int8 (float16 quantized per token: ``extra`` holds the scales)."""
    import cupy

    import cupy_maxsim as cm

    q64, d64 = unit_rows(rng, (nq, lq, dim), np.float64), unit_rows(rng, (nd, length, dim), np.float64)
    d64[5, 3, 1] = np.nan
    d_mask = holey_mask(rng, (nd, length), 0.8)
    d_mask[5, 3] = True  # the NaN's token is real (a masked one is ignored)
    d_mask[7] = False  # an empty document
    source = "float16" if dtype == "int8" else dtype
    if source == "bfloat16":
        import torch

        q = torch.from_numpy(q64).to("cuda", torch.bfloat16)
        d = torch.from_numpy(d64).to("cuda", torch.bfloat16)
        q64, d64, mask = q.double().cpu().numpy(), d.double().cpu().numpy(), torch.from_numpy(d_mask).cuda()
    else:
        q, d = cupy.asarray(q64.astype(source)), cupy.asarray(d64.astype(source))
        q64, d64, mask = q64.astype(source).astype(np.float64), d64.astype(source).astype(np.float64), cupy.asarray(d_mask)
    extra = {}
    if dtype == "int8":
        (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
        q64, d64 = to_numpy(q) * to_numpy(q_scale)[..., None], to_numpy(d) * to_numpy(d_scale)[..., None]
        extra = dict(q_scale=q_scale, d_scale=d_scale)
    return q, d, mask, extra, q64, d64, d_mask


def ragged_gpu_corpus(rng, nq: int, lq: int = 32, dim: int = 128, dtype=np.float16, docs: int = 700, longest: int = 150):
    """nq queries of lq tokens and ``docs`` packed documents of 0 to longest - 1 tokens (the
    fourth and the last empty) at ``dim``, in ``dtype`` (values it holds exactly): (q, tokens,
    offsets on the GPU, q and the tokens as float64, the host offsets)."""
    import cupy

    lengths = rng.integers(0, longest, docs)
    lengths[[3, docs - 1]] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    q64 = unit_rows(rng, (nq, lq, dim), np.float64).astype(dtype).astype(np.float64)
    t64 = unit_rows(rng, (int(offsets[-1]), dim), np.float64).astype(dtype).astype(np.float64)
    return (cupy.asarray(q64.astype(dtype)), cupy.asarray(t64.astype(dtype)), cupy.asarray(offsets),
            q64, t64, offsets)


def replay_device(framework: str):
    """For tests of replayed launches (_replay.py): a function putting a NumPy
    array on the GPU as a torch tensor or a CuPy array; skips where launches are not recorded
    (before sm_80) or torch is missing."""
    import cupy
    import pytest

    from cupy_maxsim._gpu.device import device_properties

    if device_properties(cupy.cuda.runtime.getDevice())[3] < 80:
        pytest.skip("launches are recorded for the tensor-core kernels (sm_80 and later)")
    if framework == "torch":
        torch = pytest.importorskip("torch")
        return lambda x: torch.from_numpy(x).cuda()
    return cupy.asarray


def off_alignment(device, x: np.ndarray):
    """``x`` on the GPU (through ``device``) 2 bytes past a 16-byte boundary, same shape."""
    flat = device(np.zeros(x.size + 1, x.dtype))
    flat[1:] = device(x.ravel())
    return flat[1:].reshape(x.shape)


def part_starts(first: int, end: int, parts: int, tile_rows: int) -> list:
    """The first tokens of the ``parts`` parts of the document [first, end) as maxsim_parts.cu
    cuts them: its tiles [p T / parts, (p + 1) T / parts) of T = ceil(length / tile_rows)."""
    tiles = -(-(end - first) // tile_rows)
    return [min(first + tile_rows * (p * tiles // parts), end) for p in range(parts)]


def count_calls(monkeypatch, owner, name: str) -> list:
    """A list that grows by one each time ``owner.name`` is called (which still runs)."""
    calls = []
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    return calls


class HostOutput:
    """Results in host memory instead of the caller's framework (the GPU layer stubbed)."""

    def __init__(self, like, tensor=None):
        pass

    def empty(self, shape, dtype):
        array = np.empty(shape, np.uint16 if dtype == "bfloat16" else dtype)
        return array, array.ctypes.data

    def empty_like(self, operand, array):
        return self.empty(operand.shape, operand.dtype)

    def fill(self, array, value):
        array.fill(value)

    def wrap(self, array, dtype=None):
        return array


def _stub_device_array(shape, ptr: int):
    """What the forward reads of a preprocessing kernel's CuPy output: its shape and pointer."""
    return types.SimpleNamespace(shape=tuple(shape), data=types.SimpleNamespace(ptr=ptr))


def _stub_split_queries(problem, stream):
    """_forward._split_queries without a GPU: (halves, scales) of q's tokens, made-up pointers."""
    num_queries, query_length, dim = problem.q.shape
    tokens = num_queries * query_length
    return _stub_device_array((tokens, 192 * -(-dim // 64)), 0x70000000), _stub_device_array((tokens,), 0x78000000)


def _stub_split_exponents(problem, stream):
    """_forward._split_exponents without a GPU: the exponents (a made-up pointer), their strides."""
    packed = problem.offsets is not None
    rows = problem.d.shape[0] if packed else problem.num_docs * problem.doc_length
    return _stub_device_array((rows,), 0x7c000000), 0 if packed else problem.doc_length, 1


def _stub_split_documents(problem, stream):
    """_forward._split_documents without a GPU: (halves, scales) of d's rows, made-up pointers."""
    packed = problem.offsets is not None
    rows = problem.d.shape[0] if packed else problem.num_docs * problem.doc_length
    return _stub_device_array((rows, 128 * -(-problem.d.shape[-1] // 64)), 0x68000000), \
        _stub_device_array((rows,), 0x6c000000)


@contextlib.contextmanager
def stub_gpu(monkeypatch, properties, *, get_kernel, launch=None, prepared_launch=None, doc_tile_map=None,
             offsets_summary=None, part_offsets=None):
    """The seam between the library's host logic and the GPU, stubbed for tests without one:
    device ``properties`` (gpu.device.device_properties' tuple), kernels from ``get_kernel``,
    launches (general and prepared), the current device, tensor maps, the packed offsets' check
    and the document parts' offsets where given, results in host memory (HostOutput). Every
    cache is emptied on entry and on exit, so that no plan holding a stub kernel outlives the
    block."""
    from cupy_maxsim import _arrays, _cache, _forward
    from cupy_maxsim._gpu import compile as gpu_compile
    from cupy_maxsim._gpu import device as gpu_device
    from cupy_maxsim._gpu import launch as gpu_launch
    from cupy_maxsim._gpu import tma

    _cache.clear_all()
    monkeypatch.setattr(_forward, "_split_queries", _stub_split_queries)
    monkeypatch.setattr(_forward, "_split_exponents", _stub_split_exponents)
    monkeypatch.setattr(_forward, "_split_documents", _stub_split_documents)
    monkeypatch.setattr(gpu_device, "device_properties", lambda device: properties)
    monkeypatch.setattr(gpu_device, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(gpu_compile, "get_kernel", get_kernel)
    # (launch.py's small-kernel wrappers hold their own names of both)
    monkeypatch.setattr(gpu_launch, "get_kernel", get_kernel)
    monkeypatch.setattr(gpu_launch, "device_properties", lambda device: properties)
    monkeypatch.setattr(_arrays, "Output", HostOutput)
    for owner, name, stub in ((gpu_launch, "launch", launch), (gpu_launch, "PreparedLaunch", prepared_launch),
                              (tma, "doc_tile_map", doc_tile_map), (gpu_launch, "offsets_summary", offsets_summary),
                              (gpu_launch, "part_offsets", part_offsets)):
        if stub is not None:
            monkeypatch.setattr(owner, name, stub)
    try:
        yield
    finally:
        _cache.clear_all()


def stub_driver(monkeypatch, **functions):
    """CuPy's driver module (``cupy_backends.cuda.api.driver``) stubbed with ``functions``
    (``launchKernel=...``), so that launch code runs without a GPU; returns the stub."""
    import sys
    import types

    driver = types.SimpleNamespace(**functions)
    api = types.ModuleType("cupy_backends.cuda.api")
    api.driver = driver
    for name, module in (("cupy_backends", types.ModuleType("cupy_backends")),
                         ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                         ("cupy_backends.cuda.api", api), ("cupy_backends.cuda.api.driver", driver)):
        monkeypatch.setitem(sys.modules, name, module)
    return driver
