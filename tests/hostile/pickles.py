"""Hand-written pickle opcode streams: memo bombs and deep nesting no ``pickle.dumps`` makes.

Protocol 4 opcodes (see ``pickletools``), just enough to build dicts, lists, strings and ints
and to reference an object again through the memo, which is what a memo bomb does: a list of a
million references to one dict costs two bytes per reference.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any


class Opcodes:
    """An opcode stream under construction; containers are memoized in the order built."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04")
        self.memo = 0

    def memoize(self) -> int:
        self.out += b"\x94"
        self.memo += 1
        return self.memo - 1

    def get(self, index: int) -> None:
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def mark(self) -> None:
        self.out += b"("

    def empty_list(self) -> int:
        self.out += b"]"
        return self.memoize()

    def empty_dict(self) -> int:
        self.out += b"}"
        return self.memoize()

    def append(self) -> None:
        self.out += b"a"

    def appends(self) -> None:
        self.out += b"e"

    def setitems(self) -> None:
        self.out += b"u"

    def value(self, v: Any) -> None:
        """A scalar, or a small container without shared parts, as pickle writes it."""
        if isinstance(v, str):
            data = v.encode()
            self.out += (
                b"\x8c" + bytes([len(data)]) + data
                if len(data) < 256
                else b"X" + struct.pack("<I", len(data)) + data
            )
        elif isinstance(v, bool) or v is None:
            self.out += {True: b"\x88", False: b"\x89", None: b"N"}[v]
        elif isinstance(v, int):
            data = pickle.encode_long(v)
            self.out += (
                b"\x8a" + bytes([len(data)]) + data
                if len(data) < 256
                else b"\x8b" + struct.pack("<I", len(data)) + data
            )
        elif isinstance(v, dict):
            self.dict(v)
        elif isinstance(v, list):
            self.empty_list()
            if v:
                self.mark()
                for item in v:
                    self.value(item)
                self.appends()
        else:
            raise TypeError(type(v))

    def dict(self, items: dict[str, Any]) -> int:
        index = self.open_dict(items)
        self.setitems()
        return index

    def open_dict(self, items: dict[str, Any]) -> int:
        """A dict with ``items`` and its SETITEMS still to come: more items may follow."""
        index = self.empty_dict()
        self.mark()
        for k, v in items.items():
            self.value(k)
            self.value(v)
        return index

    def repeat_into_list(self, index: int, times: int) -> None:
        """Append ``times`` more references to memo ``index`` to the list on the stack."""
        while times > 0:
            batch = min(times, 1000)
            self.mark()
            for _ in range(batch):
                self.get(index)
            self.appends()
            times -= batch

    def stop(self) -> bytes:
        return bytes(self.out + b".")


def deep_list(depth: int) -> bytes:
    """The opcodes of a list nested ``depth`` deep ([[[…]]]), to push onto a stream."""
    return b"]" * depth + b"a" * (depth - 1)


def entries_bomb(per_list: int = 1_000_000, lists: int = 1000) -> bytes:
    """``device_traces`` holding the same ``per_list``-entry list ``lists`` times."""
    p = Opcodes()
    p.empty_dict()
    p.mark()
    p.value("segments")
    p.value([])
    p.value("device_traces")
    traces = p.empty_list()
    trace = p.empty_list()
    entry = p.dict({"action": "alloc", "addr": 0x7F00_0000_0000, "size": 512, "stream": 0})
    p.append()
    p.repeat_into_list(entry, per_list - 1)
    p.append()
    p.repeat_into_list(trace, lists - 1)
    p.setitems()
    del traces
    return p.stop()


def blocks_bomb(blocks: int = 10_000, segments: int = 10_000) -> bytes:
    """``segments`` references to one segment whose block list holds ``blocks`` references
    to one block."""
    p = Opcodes()
    p.empty_dict()
    p.mark()
    p.value("segments")
    p.empty_list()
    seg = p.open_dict(
        {
            "device": 0,
            "address": 0x7F00_0000_0000,
            "total_size": 2 << 20,
            "stream": 0,
        }
    )
    p.value("blocks")
    p.empty_list()
    block = p.dict(
        {
            "address": 0x7F00_0000_0000,
            "size": 512,
            "requested_size": 512,
            "state": "active_allocated",
        }
    )
    p.append()
    p.repeat_into_list(block, blocks - 1)
    p.setitems()
    p.append()
    p.repeat_into_list(seg, segments - 1)
    p.value("device_traces")
    p.value([[]])
    p.setitems()
    return p.stop()


def shared_stack_bomb(entries: int = 100_000, frames: int = 100_000, python: bool = False) -> bytes:
    """``entries`` references to one alloc entry whose stack is ``frames`` references to one
    frame (a C++ frame, or with ``python`` a frame of the user's code at the very end)."""
    p = Opcodes()
    p.empty_dict()
    p.mark()
    p.value("segments")
    p.value([])
    p.value("device_traces")
    p.empty_list()
    trace = p.empty_list()
    entry = p.open_dict(
        {
            "action": "alloc",
            "addr": 0x7F00_0000_0000,
            "size": 512,
            "stream": 0,
            "time_us": 1,
        }
    )
    p.value("frames")
    p.empty_list()
    frame = p.dict({"name": "at::native::op(at::Tensor const&)", "filename": "??", "line": 0})
    p.append()
    p.repeat_into_list(frame, frames - 1 - int(python))
    if python:
        p.value({"name": "forward", "filename": "/home/me/model.py", "line": 7})
        p.append()
    p.setitems()
    p.append()
    p.repeat_into_list(entry, entries - 1)
    p.append()
    p.setitems()
    del trace
    return p.stop()


def with_deep_value(container: dict[str, Any], key: str, depth: int, top: Any) -> bytes:
    """``top`` (plain data) where ``container[key]`` is a list nested ``depth`` deep;
    ``container`` must be an object inside ``top``. Protocol 2: no frames to keep consistent."""
    marker = "\x00deep\x00"
    container[key] = marker
    data = pickle.dumps(top, protocol=2)
    encoded = b"X" + struct.pack("<I", len(marker)) + marker.encode()
    return data.replace(encoded, deep_list(depth), 1)
