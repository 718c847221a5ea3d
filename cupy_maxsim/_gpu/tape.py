"""Small-kernel launches recorded once and replayed with new pointers.

A repeated Index search ends in a few small launches (the selection's rounds or its wide pass,
the finish; an int8 index's query quantisation before the forward) whose Python (the kernels
looked up, the outputs allocated, the scalars packed, the geometry computed) was about half of
the call's host time (bench/results/profile-search-2026-12-05-19fbd58.txt). A :class:`Tape`
records what those launches did: each launch's function, geometry and packed scalars, and each
array the small-kernel wrappers of launch.py allocated. Every pointer parameter (a ``Q`` in
launch.SMALL_KERNEL_PARAMETERS) must be accounted for: one of the recording's inputs (patched
per replay), an array the tape allocated (allocated anew per replay) or an array the caller
declared fixed (kept alive by the tape). A pointer it cannot place (a copy made outside the
small kernels' wrappers, a launch with other arguments) leaves the tape unreplayable, so a
replay runs exactly what was recorded or nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading

_active = threading.local()


def recording_tape():
    """The tape recording on this thread, or None (launch.py's wrappers ask on every call)."""
    return getattr(_active, "tape", None)


def allocated(shape: tuple, dtype, zeroed: bool = False):
    """A CuPy array for a small kernel's output (zeros where the kernel accumulates into it), on
    the current device and stream; noted by the recording tape, if any."""
    import cupy

    array = cupy.zeros(shape, dtype) if zeroed else cupy.empty(shape, dtype)
    tape = recording_tape()
    if tape is not None:
        tape._allocations.append((array, tuple(shape), dtype, zeroed))
    return array


class Tape:
    """The small launches of one stretch of a call (``with tape.recording(...)``), replayable
    (:meth:`replay`) once :meth:`answered` has named the arrays the stretch produced."""

    def __init__(self):
        self._allocations = []  # (array, shape, dtype, zeroed) in allocation order
        self._launches = []  # (kernel, function, geometry, cooperative, packed, offsets, codes)
        self._inputs = ()
        self._fixed = ()
        self._spoiled = False
        self._steps = None  # settled by answered(): what replay() runs

    @contextlib.contextmanager
    def recording(self, inputs: tuple = (), fixed: tuple = ()):
        """Record the small launches run inside; ``inputs``: the arrays (or None) whose pointers
        change from call to call, in the order replay() takes them; ``fixed``: arrays (or None)
        the launches may read that stay the same (kept alive here)."""
        if getattr(_active, "tape", None) is not None:
            raise RuntimeError("a tape is recording already on this thread")
        self._inputs = tuple(pointer_of(x) for x in inputs)
        self._fixed = tuple(x for x in fixed if x is not None)
        _active.tape = self
        try:
            yield self
        finally:
            _active.tape = None

    def note_launch(self, kernel, function: int, geometry: tuple, cooperative: bool, scalars) -> None:
        """launch.launch's record of a small kernel's launch (``scalars``: launch.Scalars; the
        kernel held, so that its function stays loaded); any other launch (``scalars`` None:
        by-value structs) spoils the tape."""
        if scalars is None:
            self._spoiled = True
        else:
            self._launches.append((kernel, function, geometry, cooperative, scalars.packed, scalars.offsets,
                                   scalars.codes))

    def answered(self, *arrays) -> bool:
        """Name what the recorded stretch produced (each an array the tape allocated, or a view
        of one's start), and settle the tape for replay; False where it cannot be replayed (a
        pointer it cannot place, another kind of launch, an answer it did not allocate)."""
        by_pointer = {array.data.ptr: n for n, (array, _, _, _) in enumerate(self._allocations)}
        inputs = {pointer: n for n, pointer in enumerate(self._inputs) if pointer}
        fixed = {pointer_of(x) for x in self._fixed}
        answers = []
        for array in arrays:
            at = by_pointer.get(array.data.ptr)
            if at is None or self._spoiled:
                return False
            answers.append((at, tuple(array.shape)))
        steps = []
        for kernel, function, geometry, cooperative, packed, offsets, codes in self._launches:
            patches = []  # (offset, ("input" | "array", index))
            for offset, code in zip(offsets, codes):
                if code != "Q":
                    continue
                (pointer,) = struct.unpack_from("@Q", packed, offset)
                if pointer in inputs:
                    patches.append((offset, 0, inputs[pointer]))
                elif pointer in by_pointer:
                    patches.append((offset, 1, by_pointer[pointer]))
                elif pointer and pointer not in fixed:
                    return False
            buffer = ctypes.create_string_buffer(packed, len(packed))
            params = (ctypes.c_void_p * len(offsets))(*[ctypes.addressof(buffer) + o for o in offsets])
            steps.append((kernel, function, geometry, cooperative, buffer, params, tuple(patches)))
        self._steps = steps
        self._shapes = [(shape, dtype, zeroed) for _, shape, dtype, zeroed in self._allocations]
        self._answers = tuple(answers)
        self._allocations = self._launches = []  # (the recorded arrays are the recording call's: not held)
        self._lock = threading.Lock()
        return True

    def replay(self, stream_ptr: int, inputs: tuple) -> tuple:
        """The recorded launches again on ``stream_ptr`` (the current device's; CuPy's current
        stream should be it, for the allocations), each input pointer of ``inputs`` (ints, 0
        for none) in its recorded place and fresh arrays for the tape's own: the answers."""
        import cupy
        from cupy_backends.cuda.api import driver

        arrays = [cupy.zeros(shape, dtype) if zeroed else cupy.empty(shape, dtype)
                  for shape, dtype, zeroed in self._shapes]
        sources = (inputs, [array.data.ptr for array in arrays])
        with self._lock:  # (the buffers are this tape's; the driver copies them at the launch)
            for _, function, geometry, cooperative, buffer, params, patches in self._steps:
                for offset, kind, index in patches:
                    struct.pack_into("@Q", buffer, offset, sources[kind][index])
                if cooperative:
                    driver.launchCooperativeKernel(function, *geometry, stream_ptr, ctypes.addressof(params))
                else:
                    driver.launchKernel(function, *geometry, stream_ptr, ctypes.addressof(params), 0)
        return tuple(arrays[at] if arrays[at].shape == shape else arrays[at].reshape(shape)
                     for at, shape in self._answers)

    @property
    def replayable(self) -> bool:
        return self._steps is not None


def pointer_of(array) -> int:
    """A CuPy array's or torch tensor's device address; 0 for None."""
    if array is None:
        return 0
    data = getattr(array, "data", None)
    return data.ptr if hasattr(data, "ptr") else array.data_ptr()

