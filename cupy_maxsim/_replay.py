"""Repeated calls: a call's launch remembered under its signature and replayed with new pointers.

A retrieval service calls score() with the same shapes over and over, and a training step
repeats its forward and backward; a small call is host-bound (rerank-1k: the kernel takes
~25 us, the general path 40-60 us of Python). After a call of torch CUDA tensors or CuPy
arrays (masks and int8 scales included), the general path leaves what its launch needed under
the call's signature (types, shapes, strides, dtypes and devices of q, d, the masks and the
scales, whether the winners are wanted, and the tunables in force: everything its checks and
its plan read, but the pointers);
a later call with the same signature reads only the pointers and the stream, allocates the
results and launches the same kernel. backward_plan does the same for the backward's layout
(:func:`backward_key`), and score_with_plan (an autograd adapter's forward) replays both under
one key.
"""

from __future__ import annotations

import math

from . import _arrays
from ._cache import Cache
from ._gpu import device as gpu_device
from ._gpu import launch as gpu_launch
from ._gpu import tma
from ._gpu.args import FORWARD_ARGS, FORWARD_HEAD, ArgTemplate, forward_args
from ._gpu.tape import Tape, pointer_of
from .tuning import current

ITEMSIZE = _arrays.ITEMSIZE
#: Recorded forwards (:class:`Replay`) and backward templates (_backward.BackwardPlan), by signature.
replays = Cache("replays")
backward_templates = Cache("backward templates")


NO_EXTRAS = (None, None, None, None)


def replay_key(q, d, argmax=False, extras=NO_EXTRAS):
    """The signature of a score(q, d) call, or None where the general path is as cheap.
    ``extras``: its (q_mask, d_mask, q_scale, d_scale), each None or an array of q's type."""
    kind = type(q)
    if type(d) is not kind:
        return None
    module = kind.__module__
    if module == "torch":  # get_device(): the device's index (-1: CPU) without a torch.device
        key = (kind, q.shape, q.stride(), q.dtype, q.get_device(), d.shape, d.stride(), d.dtype, d.get_device(),
               argmax, current())
    elif module == "cupy":
        key = kind, q.shape, q.strides, q.dtype, q.device.id, d.shape, d.strides, d.dtype, d.device.id, argmax, current()
    else:
        return None
    if extras is NO_EXTRAS:
        return key
    for x in extras:
        if x is None:
            key += (None,)
        elif type(x) is not kind:
            return None
        elif module == "torch":
            key += ((x.shape, x.stride(), x.dtype, x.get_device()),)
        else:
            key += ((x.shape, x.strides, x.dtype, x.device.id),)
    return key


def backward_key(q, d, argmax, pairs: bool):
    """(signature, pointers of q, d and argmax) of a backward_plan(q, d, argmax) call of padded
    documents, or (None, None). Whether q and d sit on 16 bytes is part of the signature (the
    layout's vector loads need it)."""
    key = replay_key(q, d)
    if key is None or type(argmax) is not key[0]:
        return None, None
    if key[0].__module__ == "torch":
        pointers = q.data_ptr(), d.data_ptr(), argmax.data_ptr()
        key += (argmax.shape, argmax.stride(), argmax.dtype, argmax.get_device())
    else:
        pointers = q.data.ptr, d.data.ptr, argmax.data.ptr
        key += (argmax.shape, argmax.strides, argmax.dtype, argmax.device.id)
    return key + (pairs, (pointers[0] | pointers[1]) % 16 == 0), pointers


class Replay:
    """A recorded forward launch, replayed with new pointers."""

    def __init__(self, like, shape: tuple, dtype: str, argmax_dtype: str | None, plan, values: dict,
                 tile_map_shape: tuple | None, use_tma: bool, scale_strides: tuple | None = None,
                 query_map_shape: tuple | None = None, parts=None):
        self.like, self.shape, self.dtype = like, shape, dtype
        self.argmax_dtype, self.argmax_shape = argmax_dtype, shape + (like.shape[-2],)
        self.plan, self.tile_map_shape, self.use_tma = plan, tile_map_shape, use_tma
        # int8 documents' scales read by TMA: their (row, document) strides in bytes.
        self.scale_strides = scale_strides
        # A build streaming the query atoms: q's map's shape (_forward.query_map_shape).
        self.query_map_shape = query_map_shape
        self.torch = like.framework == "torch"
        self.backward = None  # a BackwardPlan template: calls answer (scores, plan) (with_backward)
        # The recorded arguments packed once; a call patches in q, d, out, argmax, the masks and
        # the scales.
        arguments = ArgTemplate(forward_args, [values[name] for name, _ in FORWARD_ARGS], FORWARD_HEAD,
                                0 if tile_map_shape is None else tma.DOC_TILE_MAP_BYTES)
        self.launch = gpu_launch.PreparedLaunch(plan.kernel, (plan.grid_x, plan.groups), (plan.threads,),
                                                plan.shared, arguments)
        # Documents scored in parts (_forward._launch_parts; ``parts``: its PartsRecord): the
        # launch above writes the parts' records, and the merge's launch the scores.
        self.parts = parts
        if parts is not None:
            merge_values = parts.merge_values
            merge = ArgTemplate(forward_args, [merge_values[name] for name, _ in FORWARD_ARGS], FORWARD_HEAD, 16)
            warps = math.prod(shape)
            self.merge = gpu_launch.PreparedLaunch(*gpu_launch.merge_parts_launch(like.device, warps), 0, merge)

    @classmethod
    def recorded(cls, problem, tunables, record: tuple) -> "Replay":
        """The replay of a general-path call of ``problem`` under ``tunables`` from what
        _forward.run recorded of it (``record``: one entry of its ``record`` list)."""
        plan, values, map_shape, scale_strides, query_shape, parts = record
        return cls(problem.like.with_changes(ptr=0, keepalive=None), problem.shape, problem.result_dtype,
                   problem.argmax_dtype, plan, values, map_shape, tunables.use_tma, scale_strides, query_shape, parts)

    def with_backward(self, template) -> "Replay":
        """This replay of a forward with winners, answering (scores, the backward plan of the
        winners from ``template``): score_with_plan replayed. The winners and the backward's
        scratch share one allocation of 4-byte words (the scratch 16-byte aligned after them)."""
        replay = object.__new__(Replay)
        replay.__dict__.update(self.__dict__)
        replay.backward = template
        argmax_bytes = math.prod(self.argmax_shape) * ITEMSIZE[self.argmax_dtype]
        replay.argmax_words = -(-argmax_bytes // 16) * 4
        replay.work_words = replay.argmax_words + template._scratch_words
        return replay

    def __call__(self, q, d, extras=NO_EXTRAS):
        """The scores (and winners, or their backward plan), or None where the general path must
        answer: a pointer not aligned as the kernel needs. ``extras``: as in replay_key."""
        if self.torch:
            q_ptr, d_ptr = q.data_ptr(), d.data_ptr()
            extra_ptrs = (0, 0, 0, 0) if extras is NO_EXTRAS else tuple(0 if x is None else x.data_ptr() for x in extras)
        else:
            q_ptr, d_ptr = q.data.ptr, d.data.ptr
            extra_ptrs = (0, 0, 0, 0) if extras is NO_EXTRAS else tuple(0 if x is None else x.data.ptr for x in extras)
        if (q_ptr | d_ptr) % 16:
            return None
        output = _arrays.Output(self.like, q if self.torch else None)
        result, out_ptr = output.empty(self.shape, self.dtype)
        argmax_ptr, plan = 0, None
        stream = self.like.stream
        if self.backward is not None:  # the winners with the backward's scratch (with_backward)
            argmax, argmax_ptr = output.empty((self.work_words,), "int32")
            # The backward staged before the forward's launch: in a step the host's path from
            # this launch to the backward's has to keep up with the forward's GPU time (ColBERT
            # in-batch: ~0.1 ms), while the path up to this launch overlaps the GPU's earlier
            # work (the encoder's, or do_bench's L2 flush).
            plan = self.backward._rebound((q_ptr, d_ptr, argmax_ptr), (q, d, argmax), stream)
            plan._stage(output, argmax_ptr + 4 * self.argmax_words, (q, d))
        elif self.argmax_dtype is not None:
            argmax, argmax_ptr = output.empty(self.argmax_shape, self.argmax_dtype)
        with gpu_device.on_device(self.like.device):
            tile_map = None
            if self.tile_map_shape is not None:
                scales = None if self.scale_strides is None else (extra_ptrs[3],) + self.scale_strides
                queries = None if self.query_map_shape is None else (q_ptr,) + self.query_map_shape
                tile_map = tma.doc_tile_map(d_ptr, *self.tile_map_shape, scales=scales, use_tma=self.use_tma,
                                            queries=queries)
            if self.parts is None:
                self.launch((q_ptr, d_ptr, out_ptr, argmax_ptr) + extra_ptrs, stream, tile_map)
            else:  # (the records live to both launches' end: the allocators keep the stream's order)
                records, records_ptr = output.empty((self.parts.record_floats,), "float32")
                self.launch((q_ptr, d_ptr, records_ptr, 0) + extra_ptrs, stream, tile_map)
                self.merge((q_ptr, d_ptr, out_ptr, 0) + extra_ptrs, stream,
                           gpu_launch.part_records(records_ptr, self.parts.parts))
        if self.argmax_dtype is None:
            return output.wrap(result)
        return output.wrap(result), plan if plan is not None else output.wrap(argmax)


def run_recorded(recorded: dict, problem, q, d, extras=NO_EXTRAS):
    """The forward of a validated ``problem`` of ``q`` against ``d`` (``extras`` as replay_key
    takes them): replayed from ``recorded`` (a caller's own replays: an Index's, per version of
    its store, whose pointers and counts the records hold) where the call's signature is there,
    else run through the general path and recorded there."""
    from . import _forward

    key = replay_key(q, d, problem.argmax_dtype is not None, extras)
    replay = None if key is None else recorded.get(key)
    result = None if replay is None else replay(q, d, extras)
    if result is not None:
        return result
    tunables, record = current(), [] if key is not None else None
    result = _forward.run(problem, tunables, record)
    if record:
        recorded[key] = Replay.recorded(problem, tunables, record[0])
    return result


def replayed(key, q, d, extras=NO_EXTRAS):
    """The call recorded under ``key`` (from replay_key) replayed for q and d (and ``extras``),
    or None: no key, none recorded, or the general path must answer."""
    replay = replays.get(key) if key is not None else None
    return None if replay is None else replay(q, d, extras)


def score_key(q, d, argmax, q_mask=None, d_mask=None, q_scale=None, d_scale=None):
    """(replay_key of a score call, the ``extras`` its replay takes): score's and search's one
    way of keying a forward (no extras at all keys shorter: the common call's key)."""
    if q_mask is None and d_mask is None and q_scale is None and d_scale is None:
        return replay_key(q, d, argmax), NO_EXTRAS
    extras = (q_mask, d_mask, q_scale, d_scale)
    return replay_key(q, d, argmax, extras), extras


#: Recorded searches (:class:`SearchReplay`, or None: not replayable) of padded corpora, by
#: score_key + (k, workspace bytes).
search_replays = Cache("search replays")


class SearchReplay:
    """A repeated search replayed whole (CuPy queries of one signature, no winners, the corpus
    scored as one block): an int8 index's query quantisation and the selection with its finish
    from their tapes (_gpu.tape), the forward from its Replay; nothing validated, planned or
    packed again (the signature, and an Index's store version, are the key)."""

    def __init__(self, like, single: bool, quantize, forward: Replay, selection):
        self.like, self.single = like, single
        self.quantize, self.forward, self.selection = quantize, forward, selection

    def __call__(self, q, d, extras):
        """(scores, ids) in the caller's framework, or None where the general path must answer.
        ``extras``: (q_mask, d_mask, q_scale, d_scale) as the forward takes them (q_scale from
        the quantisation, where the search quantises the query)."""
        stream = self.like.stream
        with gpu_device.on_device(self.like.device), gpu_device.on_stream(stream):
            stream_ptr = stream if stream is not None else _current_stream()
            if self.quantize is not None:
                q_mask = extras[0]
                q, q_scale = self.quantize.replay(stream_ptr, (pointer_of(q), pointer_of(q_mask)))
                extras = (q_mask, extras[1], q_scale, extras[3])
            scores = self.forward(q, d, extras)
            if scores is None:
                return None
            answer = self.selection.replay(stream_ptr, (pointer_of(scores),))
        output = _arrays.Output(self.like)
        return tuple(output.wrap(x[0] if self.single else x) for x in answer)


def _current_stream() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


class SearchRecorder:
    """The tapes of a search's general path (an int8 index's query quantisation; the selection
    and finish), made into a SearchReplay once the path has answered."""

    def __init__(self):
        self.quantize, self.selection = None, Tape()

    def quantized(self, q, q_mask):
        """quantize.quantize_int8(q, mask=q_mask), recorded."""
        from . import quantize

        self.quantize = Tape()
        with self.quantize.recording((q, q_mask)):
            values, scales = quantize.quantize_int8(q, mask=q_mask)
        self.quantize.answered(values, scales)
        return values, scales

    def replay(self, problem, forward: Replay | None) -> SearchReplay | None:
        """The replay of the search just run, whose forward is ``forward`` (None: not recorded),
        or None where a part of it cannot be replayed."""
        if forward is None or not self.selection.replayable or not (self.quantize is None or self.quantize.replayable):
            return None
        return SearchReplay(problem.like.with_changes(ptr=0, keepalive=None), problem.single, self.quantize, forward,
                            self.selection)


class IndexReplays:
    """An Index's recorded forwards (by replay_key) and searches (by their score_key + (k,
    workspace bytes)), for the store version they were recorded on: a new documents, offsets,
    live set or ids array (each replaced, never changed in place) drops them, since the records
    hold their pointers."""

    def __init__(self):
        self._version, self.forwards, self.searches = (), {}, {}

    def of(self, *version) -> "IndexReplays":
        """These records, emptied first where ``version`` (the store's arrays: the documents
        first, then their scales) is not theirs."""
        if len(version) != len(self._version) or any(a is not b for a, b in zip(version, self._version)):
            self._version, self.forwards, self.searches = version, {}, {}
        return self

    def searched(self, q, q_mask, k: int, workspace_bytes: int) -> tuple:
        """(the answer of a replayed search, or None; the search's key; a SearchRecorder where the
        general path should record it, else None) of an Index search without filter, winners,
        rows or q_scale."""
        tokens, scales = self._version[:2]
        key = score_key(q, tokens, False, q_mask)[0]
        key = None if key is None else key + (k, workspace_bytes)
        replay = self.searches.get(key)
        found = None if replay is None else replay(q, tokens, (q_mask, None, None, scales))
        return found, key, None if key is None or key in self.searches else SearchRecorder()

    def settle(self, key, recorder: SearchRecorder, problem, q, extras) -> None:
        """Keep the replay of the search ``recorder`` saw (``q`` and ``extras`` as its forward
        took them), or None where it cannot be replayed: the key is not recorded again."""
        self.searches[key] = recorder.replay(problem, self.forwards.get(replay_key(q, self._version[0], False, extras)))
