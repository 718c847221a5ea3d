"""cupy_maxsim.integrations.vllm against the real vLLM (0.33, CPU tensors here; .ci/run puts it
in a folder of its own): the plugin found through vLLM's own entry-point loader, its scores
equal to vLLM's reference scorer for shared and distinct queries, empty queries and documents,
fp32/fp16/bf16, and through the runner's request flow (cache_query, then score_doc); a failing
call served by vLLM's own scorer from then on; CUPY_MAXSIM_VLLM=0 keeps vLLM's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
runner_module = pytest.importorskip("vllm.v1.pool.late_interaction_runner")

from vllm.v1.pool.late_interaction import compute_maxsim_score_batched  # noqa: E402

from cupy_maxsim.integrations import vllm as cmv  # noqa: E402

Runner = runner_module.LateInteractionRunner
DIM = 24


@pytest.fixture(autouse=True)
def vllm_own_scorer_after():
    yield
    cmv.unregister()


def _rows(g, n, dtype=torch.float32):
    return torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=-1).to(dtype)


def _close(got, want, dtype=torch.float32):
    assert all(x.shape == () and x.dtype == torch.float32 for x in got)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-3  # (the reference sums in another order)
    np.testing.assert_allclose([float(x) for x in got], [float(x) for x in want], rtol=tolerance, atol=tolerance)


def test_vllms_plugin_loader_finds_and_runs_register(monkeypatch):
    import vllm.plugins

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    vllm.plugins.load_general_plugins()
    assert getattr(Runner._score, "_cupy_maxsim", False)
    cmv.register()  # loaded again (vLLM may): still one wrapper
    assert not getattr(Runner._score.__wrapped__, "_cupy_maxsim", False)
    cmv.unregister()
    assert not getattr(Runner._score, "_cupy_maxsim", False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scores_equal_vllms_reference(dtype):
    g = torch.Generator().manual_seed(0)
    lengths = [5, 1, 9, 0, 3, 30, 2, 7]
    docs = [_rows(g, n, dtype) for n in lengths]
    shared = _rows(g, 8, dtype)
    distinct = [_rows(g, n, dtype) for n in (4, 0, 7, 2, 5, 1, 32, 3)]
    two = [shared if i % 2 else distinct[0] for i in range(8)]  # two queries, each shared: packed per query
    cmv.register()
    runner = Runner(enable_flash=False)
    for queries in ([shared] * 8, distinct, two):
        _close(runner._score(queries, docs), compute_maxsim_score_batched(queries, docs), dtype)
    assert runner._score([], []) == []


def test_the_request_flow_through_the_runner():
    """cache_query requests, then score_doc requests (two queries, five documents, one of them
    empty), through postprocess_pooler_output: the outputs vLLM's own scorer gives."""
    from vllm.pooling_params import LateInteractionParams, PoolingParams

    g = torch.Generator().manual_seed(1)
    queries = {"a": _rows(g, 6), "b": _rows(g, 11)}
    docs = [("a", _rows(g, 4)), ("b", _rows(g, 9)), ("a", _rows(g, 0)), ("a", _rows(g, 13)), ("b", _rows(g, 1))]

    def run():
        runner = Runner(enable_flash=False)
        params = [PoolingParams(late_interaction_params=LateInteractionParams(
            mode="cache_query", query_key=key, query_uses=sum(k == key for k, _ in docs))) for key in queries]
        runner.postprocess_pooler_output(list(queries.values()), params, list(queries), [True] * len(queries))
        params = [PoolingParams(late_interaction_params=LateInteractionParams(mode="score_doc", query_key=key))
                  for key, _ in docs]
        ids = [f"doc-{i}" for i in range(len(docs))]
        for req_id, p in zip(ids, params):
            runner.register_request(req_id, p)
        return runner.postprocess_pooler_output([d for _, d in docs], params, ids, [True] * len(docs))

    want = run()
    cmv.register()
    got = run()
    _close(got, want)
    assert float(got[2]) == -np.inf  # the empty document


def test_a_failing_call_is_served_by_vllms_scorer(monkeypatch, caplog):
    g = torch.Generator().manual_seed(2)
    q, docs = _rows(g, 5), [_rows(g, n) for n in (3, 4)]
    cmv.register()

    def broken(queries, docs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(cmv, "score_pairs", broken)
    runner = Runner(enable_flash=False)
    with caplog.at_level("WARNING"):
        got = runner._score([q, q], docs)
    _close(got, compute_maxsim_score_batched([q, q], docs))
    assert "cupy_maxsim scoring failed" in caplog.text
    monkeypatch.undo()
    assert runner._cupy_maxsim_failed  # and later calls go to vLLM's own without trying again
    _close(runner._score([q, q], docs), compute_maxsim_score_batched([q, q], docs))


def test_cupy_maxsim_vllm_0_keeps_vllms_scorer(monkeypatch):
    monkeypatch.setenv("CUPY_MAXSIM_VLLM", "0")
    cmv.register()
    assert not getattr(Runner._score, "_cupy_maxsim", False)


def test_bad_pairs_are_refused():
    g = torch.Generator().manual_seed(3)
    with pytest.raises(ValueError, match="pair up"):
        cmv.score_pairs([_rows(g, 2)], [])
    with pytest.raises(ValueError, match="one dim"):
        cmv.score_pairs([_rows(g, 2)], [torch.zeros(3, DIM + 1)])
