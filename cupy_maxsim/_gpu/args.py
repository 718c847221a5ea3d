"""The kernels' by-value argument structs: field lists, packing, templates patched per call.

The field lists mirror ``ForwardArgs`` and ``BackwardArgs`` in kernels_cu/common.cuh, which
tests/test_packaging.py parses and compares field by field (one source of truth, checked).
"""

from __future__ import annotations

import ctypes
import struct

#: Field order of ``ForwardArgs`` and ``BackwardArgs`` in common.cuh (Q = pointer, q = int64,
#: i = int32); the packaging test checks both against the header. Each starts with the pointers
#: a repeated call changes (FORWARD_HEAD, BACKWARD_HEAD): they are patched into bytes packed once.
FORWARD_ARGS = (
    ("q", "Q"), ("d", "Q"), ("out", "Q"), ("argmax", "Q"),
    ("q_mask", "Q"), ("d_mask", "Q"), ("q_scale", "Q"), ("d_scale", "Q"),
    ("q_query_stride", "q"), ("q_row_stride", "q"), ("q_dim_stride", "q"),
    ("q_mask_query_stride", "q"), ("q_mask_row_stride", "q"),
    ("d_doc_stride", "q"), ("d_row_stride", "q"), ("d_dim_stride", "q"), ("doc_length", "q"),
    ("offsets", "Q"), ("d_mask_doc_stride", "q"), ("d_mask_row_stride", "q"),
    ("num_docs", "q"), ("docs_per_block", "q"), ("out_query_stride", "q"),
    ("q_scale_query_stride", "q"), ("q_scale_row_stride", "q"),
    ("d_scale_doc_stride", "q"), ("d_scale_row_stride", "q"),
    ("argmax_query_stride", "q"), ("argmax_doc_stride", "q"), ("doc_rotation", "q"),
    ("last_group_docs_per_block", "q"), ("long_ranges", "q"),
    ("num_queries", "i"), ("query_length", "i"), ("dim", "i"), ("offsets_are_64bit", "i"),
    ("queries_per_group", "i"), ("pairs", "i"), ("rows_per_chunk", "i"), ("argmax_is_32bit", "i"),
)
FORWARD_HEAD = ("q", "d", "out", "argmax", "q_mask", "d_mask", "q_scale", "d_scale")
BACKWARD_ARGS = (
    ("q", "Q"), ("d", "Q"), ("argmax", "Q"), ("grad_q", "Q"), ("grad_d", "Q"),
    ("sources", "Q"), ("row_ranges", "Q"), ("csr_counts", "Q"), ("partial", "Q"),
    ("grad", "Q"), ("grad_query_stride", "q"), ("grad_doc_stride", "q"),
    ("q_query_stride", "q"), ("q_row_stride", "q"),
    ("d_doc_stride", "q"), ("d_row_stride", "q"), ("doc_length", "q"),
    ("offsets", "Q"), ("argmax_query_stride", "q"), ("argmax_doc_stride", "q"), ("csr_counts_stride", "q"),
    ("num_docs", "q"), ("sources_per_doc", "q"), ("docs_per_chunk", "q"),
    ("num_queries", "i"), ("query_length", "i"), ("dim", "i"), ("offsets_are_64bit", "i"),
    ("pairs", "i"), ("argmax_is_32bit", "i"), ("count_warps", "i"), ("vector_loads", "i"),
    ("rows_per_warp", "i"), ("reserved", "i"),
)
#: What a backward's arguments patch per call: its arrays' pointers, then grad_scores' pointer
#: and strides (patched apart in a staged backward).
BACKWARD_HEAD = ("q", "d", "argmax", "grad_q", "grad_d", "sources", "row_ranges", "csr_counts", "partial")
BACKWARD_GRAD = ("grad", "grad_query_stride", "grad_doc_stride")


class ArgStruct:
    """Packs one of the argument structs into the bytes the kernel receives by value: one
    struct.pack per launch instead of dozens of NumPy scalars."""

    def __init__(self, fields):
        self.fields = fields
        self.layout = struct.Struct("<" + "".join(code for _, code in fields))

    @property
    def size(self) -> int:
        return self.layout.size

    def __call__(self, **values) -> bytes:
        return self.pack([values[name] for name, _ in self.fields])

    def pack(self, values: list) -> bytes:
        """The struct of ``values`` given in field order."""
        return self.layout.pack(*values)

    def part(self, names: tuple) -> tuple[int, struct.Struct]:
        """(offset in the packed struct, packer) of the consecutive fields ``names``: what a
        call patches in place (little-endian, no padding)."""
        order = [name for name, _ in self.fields]
        first = order.index(names[0])
        assert tuple(order[first:first + len(names)]) == tuple(names), f"{names} are not consecutive fields"
        codes = [code for _, code in self.fields]
        return (struct.calcsize("<" + "".join(codes[:first])),
                struct.Struct("<" + "".join(codes[first:first + len(names)])))


class ArgTemplate:
    """An argument struct packed once (``values`` in field order), from which each call's
    arguments are built with only the leading fields ``head`` (the pointers a repeated call
    changes) patched in. A call's arguments are one ctypes buffer that starts with
    cuLaunchKernel's parameter array: two pointer slots, to the struct at byte 16 and to a
    second argument of ``extra_bytes`` after it (the Hopper kernel's tensor map), so a
    training step builds one ctypes object per launch's arguments, not three."""

    HEADER = 16

    def __init__(self, struct_: ArgStruct, values: list, head: tuple, extra_bytes: int = 0):
        head_at, self.head = struct_.part(head)
        assert head_at == 0, "the patched fields lead the struct"
        self.head_fields = len(head)
        body = struct_.pack(values)
        self.extra_at = ArgTemplate.HEADER + -(-len(body) // 16) * 16 if extra_bytes else 0
        size = self.extra_at + extra_bytes if extra_bytes else ArgTemplate.HEADER + len(body)
        self._bytes = (bytes(ArgTemplate.HEADER) + body).ljust(size, b"\0")
        self._type = ctypes.c_char * size
        self._params_and_head = struct.Struct("<QQ" + self.head.format.lstrip("<"))

    def __call__(self, *head_values):
        """A buffer of the arguments with ``head_values`` patched in (a launch copies it: the
        caller may patch it again afterwards, and keeps it as long as it may launch it)."""
        buffer = self._type.from_buffer_copy(self._bytes)
        address = ctypes.addressof(buffer)
        self._params_and_head.pack_into(buffer, 0, address + ArgTemplate.HEADER,
                                        address + self.extra_at if self.extra_at else 0, *head_values)
        return buffer

    @staticmethod
    def fields_at(struct_: ArgStruct, names: tuple) -> tuple[int, struct.Struct]:
        """(offset in a call's buffer, packer) of the consecutive fields ``names``: what is
        patched into a call's arguments later (``packer.pack_into(buffer, offset, ...)``)."""
        offset, layout = struct_.part(names)
        return ArgTemplate.HEADER + offset, layout

    @staticmethod
    def struct_bytes(buffer, size: int) -> bytes:
        """The struct's ``size`` bytes in ``buffer`` (what the kernel receives)."""
        return bytes(buffer)[ArgTemplate.HEADER:ArgTemplate.HEADER + size]


forward_args = ArgStruct(FORWARD_ARGS)
backward_args = ArgStruct(BACKWARD_ARGS)

