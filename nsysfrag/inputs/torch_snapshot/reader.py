"""Read a PyTorch CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) into typed records.

The only module that knows the snapshot's pickle layout. A snapshot is plain data (dicts, lists,
strings, numbers, tuples), so it is read with an unpickler that refuses every global: a pickle
that asks to import anything (``os.system``, ``torch.Tensor``) is rejected before any of it
runs, and torch is never needed. Layouts accepted (see ALLOCATORS.md §2):

* the dict of ``torch.cuda.memory._snapshot()`` from PyTorch 2.1 to current: ``segments``,
  ``device_traces`` and, in newer versions, ``allocator_settings``;
* the PyTorch 2.0 layout, whose blocks carry ``history`` instead of ``address``;
* the bare list of segments that ``torch.cuda.memory_snapshot()`` returns (state only).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from nsysfrag.errors import InputError

SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
PICKLE_PROTO = 0x80  # the first byte of every pickle of protocol 2 or later
MAX_INT = 1 << 62  # addresses and sizes beyond this are not a GPU's; totals must fit int64

# Trace actions (TraceEntry::Action in CUDACachingAllocator.h); "free" is the name MemoryViz
# still accepts for a free before PyTorch split it into free_requested / free_completed.
BLOCK_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "free"})
SEGMENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})
KNOWN_ACTIONS = BLOCK_ACTIONS | SEGMENT_ACTIONS | {"oom", "snapshot"}

ALLOCATED = "allocated"
PENDING_FREE = "pending_free"
INACTIVE = "inactive"
# The C++ code says active_pending_free; the Python docstring says active_awaiting_free.
_BLOCK_STATES = {
    "active_allocated": ALLOCATED,
    "active_pending_free": PENDING_FREE,
    "active_awaiting_free": PENDING_FREE,
    "inactive": INACTIVE,
}

NO_STACK = "(no stack recorded)"
NO_PYTHON_FRAME = "(no Python frame)"
# A frame inside PyTorch itself: any path with a directory named torch (site-packages/torch/…,
# a source checkout's torch/…). Sites skip them so hotspots point at the user's code.
_TORCH_DIR = re.compile(r"(^|[\\/])torch[\\/]")
# Backward runs on the autograd engine's C++ thread: no Python frame, but the node is named.
_AUTOGRAD_NODE = re.compile(r"(\w+Backward\w*)::apply")


@dataclass(frozen=True, slots=True)
class Block:
    """A block of a segment in the final state (free blocks are not kept)."""

    address: int
    size: int  # bytes the block takes in its segment (rounded, or unsplit)
    requested_bytes: int  # what the program asked for
    pending_free: bool  # freed by the program, waiting on other streams' events
    site: str


@dataclass(frozen=True, slots=True)
class Segment:
    """One cudaMalloc'd segment, or one contiguous mapped range of an expandable segment."""

    device: int
    address: int
    size: int
    stream: int
    small_pool: bool | None  # None where the snapshot does not say
    expandable: bool
    blocks: tuple[Block, ...]  # allocated and pending-free blocks, by address


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One entry of a device's trace ring buffer."""

    action: str
    address: int  # 0 for oom and snapshot
    size: int  # requested bytes (alloc/free_*), segment or mapped bytes, rounded request (oom)
    stream: int
    time_us: int | None  # absent before PyTorch 2.1
    site: str
    device_free: int | None = None  # oom: what cudaMemGetInfo reported free


@dataclass(frozen=True)
class Snapshot:
    path: str
    layout: str  # which of the accepted layouts the file has, in words
    segments: list[Segment]
    traces: dict[int, list[TraceEntry]]  # device -> its trace, oldest first
    allocator_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF as the allocator saw it
    max_split_size: int | None = None  # bytes; None when unlimited or not recorded
    roundup_power2_divisions: dict[int, int] = field(default_factory=dict)  # MiB start -> divisions
    expandable_segments: bool = False
    unknown_actions: Counter[str] = field(default_factory=Counter)
    skipped_entries: int = 0  # trace entries without a valid address or size for their action
    time_origin_us: int | None = None  # the earliest time_us of any entry: time 0 of the report

    def devices(self) -> list[int]:
        """Devices with a segment or a trace entry, ascending."""
        found = {s.device for s in self.segments} | {d for d, t in self.traces.items() if t}
        return sorted(found)


class _RefusedGlobal(Exception):
    pass


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds containers and scalars only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedGlobal("a persistent object")


def is_snapshot(path: Path) -> bool:
    """A ``.pickle``/``.pkl`` file, or any file that starts like a pickle (protocol 2+)."""
    if path.name.lower().endswith(SNAPSHOT_SUFFIXES):
        return True
    try:
        with path.open("rb") as f:
            return f.read(1) == bytes([PICKLE_PROTO])
    except OSError:
        return False


def load_plain_pickle(path: Path) -> Any:
    """Unpickle ``path`` without importing anything; raise :class:`InputError` otherwise."""
    if not path.exists():
        raise InputError(f"{path}: no such file; pass the .pickle written by _dump_snapshot()")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass a snapshot file (.pickle)")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make the file readable")
    data = path.read_bytes()
    if not data:
        raise InputError(f"{path}: the file is empty; dump the snapshot again")
    if data[0] != PICKLE_PROTO:
        raise InputError(
            f"{path}: not a pickle (no protocol header); pass the file written by"
            " torch.cuda.memory._dump_snapshot(), or an nsys .sqlite export"
        )
    try:
        return _PlainDataUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as err:
        raise InputError(
            f"{path}: the pickle references {err}, and a memory snapshot holds only plain data;"
            " refusing to load it (never unpickle untrusted files with pickle.load)"
        ) from None
    except EOFError:
        raise InputError(
            f"{path}: the pickle is truncated; copy or dump the snapshot again"
        ) from None
    except pickle.UnpicklingError as err:
        if "truncated" in str(err):
            raise InputError(
                f"{path}: the pickle is truncated; copy or dump the snapshot again"
            ) from None
        raise InputError(f"{path}: not a readable pickle ({err}); the file is corrupt") from None
    except RecursionError:
        raise InputError(f"{path}: the pickle nests too deeply to be a memory snapshot") from None
    except MemoryError:
        raise InputError(f"{path}: the pickle does not fit in memory") from None
    except Exception as err:  # noqa: BLE001 - any malformed opcode stream is the same user error
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(
            f"{path}: not a readable pickle ({reason}); the file is corrupt or truncated"
        ) from None


def read_snapshot(path: str | Path) -> Snapshot:
    """Read the snapshot at ``path``; raise :class:`InputError` for anything unusable."""
    path = Path(path)
    return parse_snapshot(load_plain_pickle(path), str(path))


def parse_snapshot(data: Any, path: str) -> Snapshot:
    """Typed records from an unpickled snapshot (or the list ``memory_snapshot()`` returns)."""
    shape = _Shape(path)
    if isinstance(data, list):
        segments = [shape.segment(s, f"[{i}]") for i, s in enumerate(data)]
        return Snapshot(
            path,
            "segment list from torch.cuda.memory_snapshot() (state only, no trace)",
            _sorted(segments),
            {},
        )
    if not isinstance(data, dict) or "segments" not in data:
        kind = _a(data)
        raise InputError(
            f"{path}: a pickle of {kind}, not a PyTorch memory snapshot (a dict with"
            " 'segments' and 'device_traces'); write one with torch.cuda.memory._dump_snapshot()"
        )
    raw_segments = shape.list_of(data["segments"], "segments")
    segments = [shape.segment(s, f"segments[{i}]") for i, s in enumerate(raw_segments)]
    traces: dict[int, list[TraceEntry]] = {}
    unknown: Counter[str] = Counter()
    skipped = 0
    raw_traces = shape.list_of(data.get("device_traces", []), "device_traces")
    for device, raw in enumerate(raw_traces):
        entries = shape.list_of(raw, f"device_traces[{device}]")
        trace = []
        for entry in entries:
            parsed = _trace_entry(entry)
            if isinstance(parsed, TraceEntry):
                trace.append(parsed)
            elif parsed:
                unknown[parsed] += 1
            else:
                skipped += 1
        traces[device] = trace
    settings = data.get("allocator_settings")
    settings = settings if isinstance(settings, dict) else {}
    legacy = any(
        "history" in b and "address" not in b
        for s in raw_segments
        for b in s.get("blocks", [])
        if isinstance(b, dict)
    )
    timed = any(e.time_us is not None for t in traces.values() for e in t)
    if legacy:
        layout = "PyTorch 2.0 snapshot (blocks carry history)"
    elif settings:
        layout = "PyTorch snapshot with allocator_settings (2.5 or later)"
    elif timed:
        layout = "PyTorch snapshot (2.1 or later)"
    else:
        layout = "PyTorch snapshot without timestamps (2.0/2.1)"
    expandable = bool(settings.get("expandable_segments")) or any(s.expandable for s in segments)
    times = [e.time_us for t in traces.values() for e in t if e.time_us is not None]
    return Snapshot(
        path=path,
        layout=layout,
        segments=_sorted(segments),
        traces=traces,
        allocator_conf=_str_or_none(settings.get("PYTORCH_CUDA_ALLOC_CONF")),
        max_split_size=_max_split_size(settings.get("max_split_size")),
        roundup_power2_divisions=_divisions(settings.get("roundup_power2_divisions")),
        expandable_segments=expandable,
        unknown_actions=unknown,
        skipped_entries=skipped,
        time_origin_us=min(times) if times else None,
    )


def _sorted(segments: list[Segment]) -> list[Segment]:
    return sorted(segments, key=lambda s: (s.device, s.address))


def site_of(frames: object) -> str:
    """``file:line function`` of the innermost Python frame outside torch/, for hotspots.

    Frames run innermost first. C++ frames (``.cpp``, ``??``, CPython's own ``.c``) are
    skipped; when every Python frame is inside torch, the innermost of those is used, and a
    stack with no Python frame at all (autograd's backward thread) is named by its autograd
    node, ``autograd MmBackward0``.
    """
    if not isinstance(frames, list) or not frames:
        return NO_STACK
    first_python = None
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = frame.get("filename")
        if not isinstance(filename, str) or not filename.endswith(".py"):
            continue
        if first_python is None:
            first_python = frame
        if not _TORCH_DIR.search(filename):
            return _frame_text(frame)
    if first_python is not None:
        return _frame_text(first_python)
    for frame in frames:
        m = _AUTOGRAD_NODE.search(str(frame.get("name", ""))) if isinstance(frame, dict) else None
        if m:
            return f"autograd {m.group(1)}"
    return NO_PYTHON_FRAME


def _frame_text(frame: dict[str, Any]) -> str:
    # The last two path components: enough to tell model.py files apart, short enough to read.
    parts = re.split(r"[\\/]", str(frame.get("filename", "")))
    name = "/".join(p for p in parts[-2:] if p)
    return f"{name}:{frame.get('line', '?')} {frame.get('name', '?')}"


def _trace_entry(entry: object) -> TraceEntry | str | None:
    """The entry, or its action name when the action is unknown, or None when malformed."""
    if not isinstance(entry, dict):
        return None
    action = entry.get("action")
    if not isinstance(action, str):
        return None
    if action not in KNOWN_ACTIONS:
        return action
    size = entry.get("size", 0)
    stream = entry.get("stream", 0)
    time_us = entry.get("time_us")
    free = entry.get("device_free")
    device_free = int(free) if action == "oom" and _is_int(free) else None
    address = 0 if action in ("oom", "snapshot") else entry.get("addr")
    if not (_is_int(address) and _is_int(size)) or not (
        0 <= address < MAX_INT and 0 <= size < MAX_INT
    ):
        return None
    return TraceEntry(
        action=action,
        address=int(address),
        size=int(size),
        stream=int(stream) if _is_int(stream) else 0,
        time_us=int(time_us) if _is_int(time_us) else None,
        site=site_of(entry.get("frames"))
        if action in ("alloc", "free_completed", "free", "oom")
        else NO_STACK,
        device_free=device_free,
    )


class _Shape:
    """Checks the parts of the pickle the model needs; one clear line for what is wrong."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, what: str) -> InputError:
        return InputError(
            f"{self.path}: not a PyTorch memory snapshot: {where} {what}; write one with"
            " torch.cuda.memory._dump_snapshot()"
        )

    def list_of(self, value: object, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"is {_a(value)}, not a list")
        return value

    def integer(self, d: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
        value = d.get(key, default)
        if not _is_int(value) or not 0 <= value < MAX_INT:
            raise self.fail(f"{where}.{key}", "is missing, not an integer or out of range")
        return int(value)

    def segment(self, seg: object, where: str) -> Segment:
        if not isinstance(seg, dict):
            raise self.fail(where, f"is {_a(seg)}, not a segment dict")
        address = self.integer(seg, "address", where)
        total = self.integer(seg, "total_size", where)
        blocks: list[Block] = []
        offset = address
        for j, b in enumerate(self.list_of(seg.get("blocks"), f"{where}.blocks")):
            bw = f"{where}.blocks[{j}]"
            if not isinstance(b, dict):
                raise self.fail(bw, f"is {_a(b)}, not a block dict")
            size = self.integer(b, "size", bw)
            # 2.0 blocks have no address: they tile the segment in order.
            start = self.integer(b, "address", bw, default=offset)
            offset = start + size
            state = _BLOCK_STATES.get(str(b.get("state")))
            if state is None:
                raise self.fail(f"{bw}.state", f"is {b.get('state')!r}, not a block state")
            if state == INACTIVE:
                continue
            requested, frames = _requested_and_frames(b, size)
            blocks.append(Block(start, size, requested, state == PENDING_FREE, site_of(frames)))
        segment_type = seg.get("segment_type")
        return Segment(
            device=self.integer(seg, "device", where, default=0),
            address=address,
            size=total,
            stream=int(seg["stream"]) if _is_int(seg.get("stream")) else 0,
            small_pool=None if segment_type not in ("small", "large") else segment_type == "small",
            expandable=bool(seg.get("is_expandable", False)),
            blocks=tuple(sorted(blocks, key=lambda b: b.address)),
        )


def _requested_and_frames(b: dict[str, Any], size: int) -> tuple[int, object]:
    """As _memory_viz._block_extra: 2.0 blocks keep both in their first history entry."""
    if "frames" not in b and isinstance(b.get("history"), list) and b["history"]:
        first = b["history"][0]
        if isinstance(first, dict) and _is_int(first.get("real_size")):
            return int(first["real_size"]), first.get("frames")
    requested = b.get("requested_size")
    return (int(requested) if _is_int(requested) else size), b.get("frames")


def _a(value: object) -> str:
    """``an int``, ``a str``: the value's type, for a message."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _max_split_size(value: object) -> int | None:
    # SIZE_MAX (unlimited) arrives as -1 or 2**63-1 after the int64 cast.
    if not _is_int(value) or value <= 0 or value >= (1 << 62):
        return None
    return int(value)


def _divisions(value: object) -> dict[int, int]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for k, v in value.items():
        try:
            out[int(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return out


def describe_actions(counts: Counter[str], limit: int = 5) -> str:
    """``foo ×3, bar ×1`` for a warning."""
    items: Sequence[tuple[str, int]] = counts.most_common(limit)
    text = ", ".join(f"{name!r} ×{n}" for name, n in items)
    return text + (", …" if len(counts) > limit else "")
