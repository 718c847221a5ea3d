"""Small end-to-end training runs, PyTorch and JAX: a linear projection of synthetic token
features trained with an in-batch contrastive loss over MaxSim scores, once through cupy_maxsim
and once through the naive implementation (the full similarity tensor), from the same start and
on the same batches. Prints both loss curves' ends and their largest gap; writes JSON.

Data: each pair shares a random "topic"; query tokens and document tokens are noisy mixtures of
their topic and of shared distractors, so the projection has something to learn.

    python bench/train_demo.py --out bench/results/train-demo.json [--framework torch|jax|both]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

FEATURES, DIM, LQ, LD, BATCH, STEPS, LR, TAU = 64, 32, 16, 48, 32, 80, 0.2, 0.1


def make_batches(seed=0):
    rng = np.random.default_rng(seed)
    distractors = rng.standard_normal((8, FEATURES))
    batches = []
    for _ in range(STEPS):
        topics = rng.standard_normal((BATCH, FEATURES))
        q = 0.6 * topics[:, None] + rng.standard_normal((BATCH, LQ, FEATURES)) \
            + distractors[rng.integers(0, 8, (BATCH, LQ))]
        d = 0.6 * topics[:, None] + rng.standard_normal((BATCH, LD, FEATURES)) \
            + distractors[rng.integers(0, 8, (BATCH, LD))]
        batches.append((q.astype(np.float32), d.astype(np.float32)))
    w0 = (rng.standard_normal((FEATURES, DIM)) / np.sqrt(FEATURES)).astype(np.float32)
    return batches, w0


def torch_run(batches, w0, use_ours: bool):
    import torch

    import cupy_maxsim.torch as cmt

    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.tensor(w0, device="cuda", requires_grad=True)
    labels = torch.arange(BATCH, device="cuda")
    losses = []
    for q_np, d_np in batches:
        q = torch.nn.functional.normalize(torch.from_numpy(q_np).cuda() @ w, dim=-1)
        d = torch.nn.functional.normalize(torch.from_numpy(d_np).cuda() @ w, dim=-1)
        if use_ours:
            scores = cmt.maxsim(q, d)
        else:
            scores = torch.einsum("qtd,nld->qntl", q, d).amax(dim=-1).sum(dim=-1)
        loss = torch.nn.functional.cross_entropy(scores / (TAU * LQ), labels)
        w.grad = None
        loss.backward()
        with torch.no_grad():
            w -= LR * w.grad
        losses.append(float(loss.detach()))
    return losses


def jax_run(batches, w0, use_ours: bool):
    import jax
    import jax.numpy as jnp

    import cupy_maxsim.jax as cmj

    # float32 matrix products in float32 (not TF32) on the GPU, as in the torch run: the two
    # curves then differ only by the order of float32 additions.
    jax.config.update("jax_default_matmul_precision", "highest")

    def scores_of(w, q_np, d_np):
        q = q_np @ w
        d = d_np @ w
        q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
        d = d / jnp.linalg.norm(d, axis=-1, keepdims=True)
        if use_ours:
            return cmj.maxsim(q, d)
        return jnp.einsum("qtd,nld->qntl", q, d, precision="highest").max(axis=-1).sum(axis=-1)

    def loss_fn(w, q_np, d_np):
        logits = scores_of(w, q_np, d_np) / (TAU * LQ)
        return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=1)))

    step = jax.jit(jax.value_and_grad(loss_fn))
    w = jnp.asarray(w0)
    losses = []
    for q_np, d_np in batches:
        loss, grad = step(w, jnp.asarray(q_np), jnp.asarray(d_np))
        w = w - LR * grad
        losses.append(float(loss))
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    args = parser.parse_args(argv)
    batches, w0 = make_batches()
    report = {"steps": STEPS, "batch": BATCH, "lq": LQ, "ld": LD, "dim": DIM}
    runs = {"torch": torch_run, "jax": jax_run}
    for name in (("torch", "jax") if args.framework == "both" else (args.framework,)):
        ours = runs[name](batches, w0, True)
        naive = runs[name](batches, w0, False)
        gap = float(np.max(np.abs(np.array(ours) - np.array(naive))))
        report[name] = {"ours": ours, "naive": naive, "max_abs_gap": gap,
                        "first_loss": ours[0], "last_loss": ours[-1],
                        "loss_lowered": ours[-1] < 0.8 * ours[0]}
        print(f"{name}: loss {ours[0]:.4f} -> {ours[-1]:.4f} (naive {naive[0]:.4f} -> {naive[-1]:.4f}), "
              f"largest gap between the curves {gap:.2e}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
