"""cupy_maxsim.integrations.colpali_engine against colpali-engine itself (issue 26, item 4): its
MaxSim functions, its five late-interaction losses (loss and gradients, patched against
unpatched) and its processors' score_multi_vector, on zero-padded inputs. float32 on the CPU,
within 1e-5; the losses on the GPU in float16 and bfloat16 within the FlashAttention rule."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("colpali_engine")

from colpali_engine.loss import late_interaction_losses as colpali_losses  # noqa: E402
from colpali_engine.utils import maxsim as colpali_maxsim  # noqa: E402
from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor  # noqa: E402

from cupy_maxsim.integrations import colpali_engine as ours  # noqa: E402
from support import assert_flash_attention_rule  # noqa: E402


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")  # colpali-engine's own einsum path


def _zero_padded(rng, shape, shift=0.0):
    """Unit rows with zero rows at the end of each sequence (colpali-engine's padding)."""
    x = rng.standard_normal(shape) + shift
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    lengths = rng.integers(1, shape[-2] + 1, shape[:-2])
    x[np.arange(shape[-2]) >= lengths[..., None]] = 0.0
    return torch.tensor(x, dtype=torch.float32)


def _close(a, b):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_maxsim_functions_match():
    rng = np.random.default_rng(0)
    q, d = _zero_padded(rng, (4, 9, 16)), _zero_padded(rng, (6, 13, 16))
    _close(ours.maxsim_inbatch(q, d), colpali_maxsim.maxsim_inbatch(q, d))
    groups = _zero_padded(rng, (4, 3, 11, 16))
    _close(ours.maxsim_kd(q, groups), colpali_maxsim.maxsim_kd(q, groups))
    pairs = _zero_padded(rng, (4, 13, 16))
    _close(ours.maxsim_pairs(q, pairs), torch.einsum("bnd,bsd->bns", q, pairs).amax(2).sum(1))


LOSSES = ["ColbertLoss", "ColbertPairwiseCELoss", "ColbertSigmoidLoss", "ColbertNegativeCELoss",
          "ColbertPairwiseNegativeCELoss"]


def _loss_and_gradients(name, q, d, negatives):
    loss = getattr(colpali_losses, name)()
    inputs = [x.clone().requires_grad_() for x in ((q, d, negatives) if "Negative" in name else (q, d))]
    value = loss(*inputs)
    value.backward()
    return value.detach(), [x.grad for x in inputs]


@pytest.mark.parametrize("name", LOSSES)
def test_losses_match_patched_and_unpatched(name):
    rng = np.random.default_rng(1)
    q, d, negatives = _zero_padded(rng, (6, 9, 16)), _zero_padded(rng, (6, 13, 16)), _zero_padded(rng, (6, 2, 13, 16))
    theirs = _loss_and_gradients(name, q, d, negatives)
    replaced = ours.patch()
    try:
        assert "colpali_engine.loss.late_interaction_losses.maxsim_inbatch" in replaced
        mine = _loss_and_gradients(name, q, d, negatives)
    finally:
        ours.unpatch()
    _close(mine[0], theirs[0])
    # Gradients of the real rows. A zero (padding) row ties with the others at 0: torch's amax
    # splits the gradient among tied rows, ours gives it to the first; either way it lands on
    # padding, which the model zeroes (colpali-engine multiplies by the attention mask).
    for x, got, want in zip((q, d, negatives), mine[1], theirs[1]):
        real = x.abs().sum(-1) != 0
        _close(got[real], want[real])
    assert colpali_losses.maxsim_inbatch is colpali_maxsim.maxsim_inbatch  # unpatched


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", LOSSES)
def test_losses_on_the_gpu_within_the_flash_attention_rule(name, dtype):
    """On the GPU in float16 / bfloat16: our loss and gradients against colpali-engine's own
    (unpatched, its torch einsum) in float64 on the same rounded inputs, at most twice the error
    of its own in the same precision (the FlashAttention rule)."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rng = np.random.default_rng(2)
    low = getattr(torch, dtype)
    inputs = [x.to("cuda", low) for x in (_zero_padded(rng, (16, 20, 128)), _zero_padded(rng, (16, 300, 128)),
                                         _zero_padded(rng, (16, 2, 300, 128)))]
    theirs = _loss_and_gradients(name, *inputs)
    exact = _loss_and_gradients(name, *(x.double() for x in inputs))
    ours.patch()
    try:
        mine = _loss_and_gradients(name, *inputs)
    finally:
        ours.unpatch()
    assert_flash_attention_rule(mine[0], theirs[0], exact[0], what="loss")
    for i, (x, got, want, reference) in enumerate(zip(inputs, mine[1], theirs[1], exact[1])):
        real = (x.abs().sum(-1) != 0)[..., None].expand(x.shape)  # padding rows: see above
        assert_flash_attention_rule(got, want, reference, where=real, what=f"gradient {i}")


def test_score_multi_vector_matches():
    rng = np.random.default_rng(2)
    # A shared direction: every real similarity positive, where colpali-engine's zero padding and
    # our packed pages agree (the module docstring).
    queries = [_zero_padded(rng, (1, n, 16), shift=1.0)[0, :n] for n in (5, 9, 3)]
    pages = [_zero_padded(rng, (1, n, 16), shift=1.0)[0, :n] for n in (20, 7, 31, 1, 12)]
    want = BaseVisualRetrieverProcessor.score_multi_vector(queries, pages, batch_size=2, device="cpu")
    got = ours.score_multi_vector(queries, pages, batch_size=2, device="cpu")
    assert got.dtype == torch.float32 and got.device.type == "cpu" and got.shape == (3, 5)
    _close(got, want)
    ours.patch()
    try:
        _close(BaseVisualRetrieverProcessor.score_multi_vector(queries, pages, device="cpu"), want)
    finally:
        ours.unpatch()
    with pytest.raises(ValueError, match="queries"):
        ours.score_multi_vector([], pages)
