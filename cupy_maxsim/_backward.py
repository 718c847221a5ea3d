"""The backward on a prepared layout: a plan of one forward's winners, launched per gradient.

:class:`BackwardPlan` holds a validated :class:`~cupy_maxsim._problem.BackwardProblem`, its
layout from the pure planner (_plan/backward.py), the kernels and their argument struct packed
once; :meth:`BackwardPlan.gradients` launches for a gradient of the scores. Autograd adapters
settle all of it in the forward (and stage the first gradients' outputs there), so that their
backward only reads ``grad_scores`` and launches.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _cpu
from ._gpu import compile as gpu_compile
from ._gpu import device as gpu_device
from ._gpu import launch as gpu_launch
from ._gpu.args import BACKWARD_ARGS, BACKWARD_GRAD, BACKWARD_HEAD, ArgTemplate, backward_args
from ._plan.backward import SCRATCH_PARTS, plan_backward
from ._problem import FLOAT_DTYPES, BackwardProblem, check_device, internal_operand
from ._arrays import Operand, as_operand
from .tuning import Tunables

assert BACKWARD_HEAD[-len(SCRATCH_PARTS):] == SCRATCH_PARTS
#: grad_scores' pointer and strides (where they sit in a call's argument buffer, and their
#: packer): what a staged backward patches.
GRAD_AT, GRAD_FIELDS = ArgTemplate.fields_at(backward_args, BACKWARD_GRAD)


def host_gradient(output: _arrays.Output, array: np.ndarray, dtype: str):
    """A CPU-backend gradient (compute dtype) in the caller's dtype and framework."""
    if dtype != "bfloat16":
        return output.wrap(array.astype(dtype, copy=False))
    return output.wrap(_arrays.bfloat16_bits(array), dtype="bfloat16")



def _unit_dim_stride(operand: Operand) -> Operand:
    """The backward kernels read rows with unit dim stride: copy a strided operand once."""
    if operand.strides[-1] == 1 or operand.shape[-1] <= 1:
        return operand
    import cupy

    with gpu_device.on_stream(operand.stream):
        copy = cupy.ascontiguousarray(operand.cupy())
    return internal_operand(copy, operand.name, operand)


class BackwardPlan:
    """:func:`score_backward` for one forward's operands and winners (from
    :func:`backward_plan`): on a GPU the checks and the launches' layout are settled, and
    :meth:`gradients` launches the backward for a gradient of the scores: one launch where a
    document's winners fit (dD blocks invert their own rows'), else the inverse CSR with dQ,
    then dD. Holds the scratch (CSR, row lists, dQ partial sums) of its last gradients until
    it is dropped."""

    def __init__(self, problem: BackwardProblem, tunables: Tunables):
        self.problem, self.tunables = problem, tunables
        self.like, self.q, self.d, self.argmax, self.offsets = (problem.like, problem.q, problem.d, problem.argmax,
                                                                problem.offsets)
        self.pairs, self.single, self.scores_shape = problem.pairs, problem.single, problem.scores_shape
        # GPU: the kernels' arguments packed once (_args: all but the pointers of the arrays,
        # the gradients, the scratch and grad_scores; None: an empty problem), the arrays'
        # pointers, and what gradients() launches (one launch, or the CSR with dQ, then dD with
        # the sum of dQ's chunks), all settled in the forward: a training step's backward host
        # path is on its critical path.
        self._args = None
        self._pointers = ()
        self._launches = None
        self._scratch_words, self._scratch_bytes = 0, ()
        self._prepared = self._reusable = False
        self._staged = None  # the first gradients, staged in the forward: (grad_q, grad_d, argument buffer)

    def gradients(self, grad_scores):
        """(grad_q, grad_d), shaped and typed like ``q`` and ``d``, in ``q``'s framework."""
        like = self.like
        grad = as_operand(grad_scores, "grad_scores")
        if grad.dtype not in FLOAT_DTYPES:
            raise TypeError(f"grad_scores must be a float array, got dtype {grad.dtype}")
        if tuple(grad.shape) != self.scores_shape:
            raise ValueError(f"grad_scores must have the scores' shape {self.scores_shape}, got {tuple(grad.shape)}")
        check_device(like, grad)
        output = _arrays.Output(like)
        if not like.on_gpu:
            grad_host = grad.host[None] if self.single else grad.host  # one query: a batch of one
            argmax_host = self.argmax.host[None] if self.single else self.argmax.host
            grad_q, grad_d = _cpu.score_backward(grad_host, self.q.host, self.d.host, argmax_host,
                                                 None if self.offsets is None else self.offsets.host, self.pairs)
            return (host_gradient(output, grad_q.reshape(like.shape), like.dtype),
                    host_gradient(output, grad_d, self.d.dtype))
        if not self._prepared:
            self._prepare_gpu()
        return self._gpu_gradients(grad, output)

    def _prepare_gpu(self) -> None:
        """Launch geometry, scratch and arguments (they need only the winners' layout)."""
        like, q, d, problem = self.like, self.q, self.d, self.problem
        num_queries, query_length, dim = q.shape
        num_docs = self.scores_shape[-1] if not self.pairs else self.scores_shape[0]
        self._stream, self._prepared = like.stream, True
        if num_queries == 0 or query_length == 0 or dim == 0 or num_docs == 0 or problem.longest == 0:
            return  # gradients are zeros
        if (query_length if self.pairs else num_queries * query_length) >= 2**31:
            raise ValueError(f"at most 2^31 - 1 query tokens per backward, got {num_queries * query_length}")
        with gpu_device.on_device(like.device), gpu_device.on_stream(self._stream):
            self.q, self.d = q, d = _unit_dim_stride(q), _unit_dim_stride(d)
            # A later plan of the same signature may reuse this one's layout unless operands were
            # copied here (their pointers would not be the caller's).
            self._reusable = q is problem.q and d is problem.d and self.offsets is None
            layout = plan_backward(q, d, self.argmax, self.offsets, self.pairs, num_docs, problem.longest,
                                   gpu_device.device_properties(like.device), self.tunables)
            defines = self.tunables.bwd_defines
            self._launches = tuple(
                gpu_launch.PreparedLaunch(gpu_compile.get_kernel(like.device, "maxsim_bwd", launch.name, defines,
                                                                 launch.shared),
                                          launch.grid, launch.block, launch.shared)
                for launch in layout.launches)
            self._scratch_words, self._scratch_bytes = layout.scratch_words, layout.scratch_bytes
            # A reusable plan's template holds no pointer of its arrays (offsets: not reusable).
            self._args = ArgTemplate(backward_args, [layout.values[name] for name, _ in BACKWARD_ARGS], BACKWARD_HEAD)
        self._pointers = q.ptr, d.ptr, self.argmax.ptr

    def _template(self) -> "BackwardPlan":
        """This plan without its arrays: what a later plan of the same signature starts from."""
        template = object.__new__(BackwardPlan)
        template.__dict__.update(self.__dict__)
        template.like = self.like.with_changes(ptr=0, keepalive=None)
        template.q = self.q.with_changes(ptr=0, keepalive=None)
        template.d = self.d.with_changes(ptr=0, keepalive=None)
        template.argmax = self.argmax.with_changes(ptr=0, keepalive=None)
        template._scratch = template._stream = template._staged = None
        template.problem = None  # its operands hold the caller's arrays
        template._pointers = ()
        return template

    def _rebound(self, pointers: tuple, arrays: tuple, stream: int | None) -> "BackwardPlan":
        """A prepared plan of this template's signature for the arrays (q, d, argmax) at
        ``pointers``, launching on ``stream`` (the caller's, read once per call)."""
        plan = object.__new__(BackwardPlan)
        plan.__dict__.update(self.__dict__)
        plan._keepalive = arrays
        plan._stream = stream
        plan._pointers = pointers
        return plan

    def _stage(self, output: _arrays.Output | None = None, scratch_ptr: int | None = None, arrays: tuple | None = None) -> None:
        """The first gradients' outputs and arguments, all but grad_scores', settled now (GPU
        plans; nothing for host ones), with scratch the caller allocated (a replayed step: with
        the winners) or its own. An autograd adapter's forward stages them on its own thread
        (gradients() does, for a plan nothing staged, just before launching). Torch runs the
        backward on a thread of its own, where each host step took about twice as long as on
        the forward's (H200 host, bench/results/host-timeline-2026-11-30-d330621.txt): there,
        only grad_scores is read and the kernels launched. ``arrays``: the caller's q and d
        (default: the operands')."""
        if self._args is None:
            return
        output = output if output is not None else _arrays.Output(self.like)
        if scratch_ptr is None:
            self._scratch, scratch_ptr = output.empty((self._scratch_words,), "int32")
        q_array, d_array = arrays if arrays is not None else (self.like.keepalive, self.d.keepalive)
        grad_q, grad_q_ptr = output.empty_like(self.like, q_array)
        grad_d, grad_d_ptr = output.empty_like(self.d, d_array)
        self._staged = grad_q, grad_d, self._arguments(scratch_ptr, grad_q_ptr, grad_d_ptr)

    def _arguments(self, scratch_ptr: int, grad_q_ptr: int, grad_d_ptr: int):
        """The kernels' argument buffer with this forward's, the gradients' and the scratch's
        pointers; grad_scores' patched in later (GRAD_FIELDS)."""
        sources, row_ranges, csr_counts, partial = self._scratch_bytes
        q_ptr, d_ptr, argmax_ptr = self._pointers
        return self._args(q_ptr, d_ptr, argmax_ptr, grad_q_ptr, grad_d_ptr,
                          0 if sources is None else scratch_ptr + sources,
                          0 if row_ranges is None else scratch_ptr + row_ranges,
                          0 if csr_counts is None else scratch_ptr + csr_counts,
                          0 if partial is None else scratch_ptr + partial)

    def staged_gradients(self, grad_ptr: int, grad_strides: tuple):
        """The staged first gradients (grad_q, grad_d) in ``q``'s framework for a float32
        gradient of the scores at ``grad_ptr`` with ``grad_strides`` (elements, the scores'
        dims), or None where nothing is staged (a host plan, an empty problem, or a second
        backward of the same forward: :meth:`gradients` answers). For an autograd adapter
        whose engine has already checked the gradient (torch: the scores' shape, dtype and
        device): torch runs the backward on a thread where host time counts double."""
        staged, self._staged = self._staged, None
        if staged is None:
            return None
        grad_q, grad_d, args = staged
        GRAD_FIELDS.pack_into(args, GRAD_AT, grad_ptr, *self._grad_strides(grad_strides))
        stream = self._stream
        with gpu_device.on_device(self.like.device):
            if self.offsets is not None and not self.problem.cover:
                _arrays.Output(self.like).fill(grad_d, 0)  # tokens outside every document get no gradient
            for launch in self._launches:
                launch.launch_packed(args, stream)
        return grad_q, grad_d

    def _grad_strides(self, strides) -> tuple:
        """The kernels' (query, document) strides of grad_scores from its own: a 1-D gradient is
        per pair (pairs) or per document (one query)."""
        if len(strides) == 1:
            return (strides[0], 0) if self.pairs else (0, strides[0])
        return tuple(strides)

    def _gpu_gradients(self, grad: Operand, output: _arrays.Output):
        like = self.like
        if self._args is None:  # an empty problem: zero gradients
            grad_q, _ = output.empty(like.shape, like.dtype)
            grad_d, _ = output.empty(self.d.shape, self.d.dtype)
            output.fill(grad_q, 0)
            output.fill(grad_d, 0)
            return output.wrap(grad_q, like.dtype), output.wrap(grad_d, self.d.dtype)
        if grad.dtype != "float32":  # the kernels read float32
            with gpu_device.on_device(like.device), gpu_device.on_stream(self._stream):
                grad = internal_operand(grad.cupy().astype(np.float32), "grad_scores", grad)
        # An autograd adapter's forward staged the first gradients (_stage); otherwise, or for a
        # second backward of the same forward (retain_graph: autograd may hold the first
        # gradients), outputs and scratch of their own, staged now: one launch path.
        if self._staged is None:
            self._stage(output)
        grad_q, grad_d = self.staged_gradients(grad.ptr, tuple(grad.strides))
        return output.wrap(grad_q, like.dtype), output.wrap(grad_d, self.d.dtype)
