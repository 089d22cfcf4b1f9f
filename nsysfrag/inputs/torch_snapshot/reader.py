"""Read a PyTorch CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) into typed records.

The only module that knows the snapshot's pickle layout. A snapshot is plain data (dicts, lists,
strings, numbers, tuples), so it is read with an unpickler that refuses every global
(``unpickle``): a pickle that asks to import anything (``os.system``, ``torch.Tensor``) is
rejected before any of it runs, and torch is never needed. Layouts accepted:

* the dict of ``torch.cuda.memory._snapshot()`` from PyTorch 2.1 to current: ``segments``,
  ``device_traces`` and, in newer versions, ``allocator_settings``;
* the PyTorch 2.0 layout, whose blocks carry ``history`` instead of ``address``;
* the bare list of segments that ``torch.cuda.memory_snapshot()`` returns (state only).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from nsysfrag.errors import InputError
from nsysfrag.inputs.torch_snapshot.limits import ExpansionLimit
from nsysfrag.inputs.torch_snapshot.unpickle import (
    PICKLE_PROTO,
    load_pickle_bytes,
    load_plain_pickle,
    paused_gc,
)
from nsysfrag.models.snapshot_entries import (
    ACTION_KINDS,
    NO_STACK,
    Block,
    HistoryEntry,
    Segment,
)

# Read from here by the other snapshot readers, and the records' types (defined beside the
# model that replays them) by whoever read them from here before.
__all__ = [
    "ACTION_KINDS",
    "NO_STACK",
    "Block",
    "HistoryEntry",
    "Segment",
    "load_pickle_bytes",
    "load_plain_pickle",
    "paused_gc",
]

SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
MAX_INT = 1 << 62  # addresses and sizes beyond this are not a GPU's; totals must fit int64
INT64 = 1 << 63
# time_us is microseconds since the epoch; 2**53 us is the year 2255, and keeps every time
# difference, in ns, inside int64.
MAX_TIME_US = 1 << 53

# Trace actions (TraceEntry::Action in CUDACachingAllocator.h); "free" is the name MemoryViz
# still accepts for a free before PyTorch split it into free_requested / free_completed.
BLOCK_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "free"})
SEGMENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})
KNOWN_ACTIONS = BLOCK_ACTIONS | SEGMENT_ACTIONS | {"oom", "snapshot"}
SITE_ACTIONS = frozenset({"alloc", "free_completed", "free", "oom"})  # entries whose stack is kept

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

NO_PYTHON_FRAME = "(no Python frame)"
FRAME_CHARS = 500  # the longest frame text a report shows
# A frame inside PyTorch itself: any path with a directory named torch (site-packages/torch/…,
# a source checkout's torch/…). Sites skip them so hotspots point at the user's code.
_TORCH_DIR = re.compile(r"(^|[\\/])torch[\\/]")
# Backward runs on the autograd engine's C++ thread: no Python frame, but the node is named.
_AUTOGRAD_NODE = re.compile(r"(\w+Backward\w*)::apply")


@dataclass(frozen=True)
class Snapshot:
    path: str
    layout: str  # which of the accepted layouts the file has, in words
    segments: list[Segment]
    histories: dict[int, list[HistoryEntry]]  # device -> its history entries, oldest first
    allocator_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF as the allocator saw it
    max_split_size: int | None = None  # bytes; None when unlimited or not recorded
    roundup_power2_divisions: dict[int, int] = field(default_factory=dict)  # MiB start -> divisions
    expandable_segments: bool = False
    unknown_actions: Counter[str] = field(default_factory=Counter)
    skipped_entries: int = 0  # history entries without a valid address or size for their action
    time_origin_us: int | None = None  # the earliest time_us of any entry: time 0 of the report
    warnings: list[str] = field(default_factory=list)  # values the reader ignored, in words

    def devices(self) -> list[int]:
        """Devices with a segment or a history entry, ascending."""
        found = {s.device for s in self.segments} | {d for d, h in self.histories.items() if h}
        return sorted(found)


def segments_by_device(segments: Sequence[Segment]) -> dict[int, list[Segment]]:
    """Each device's segments, in one pass (filtering them per device is quadratic: 20,000
    devices took 35 s)."""
    found: dict[int, list[Segment]] = {}
    for segment in segments:
        found.setdefault(segment.device, []).append(segment)
    return found


class BadField(Exception):
    """A value the model needs is out of range: ``where`` (``device_traces[0][7].time_us``)
    and what is wrong with it; the caller prefixes the file."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where} {what}")


def is_snapshot(path: Path) -> bool:
    """A ``.pickle``/``.pkl`` file, or any file that starts like a pickle (protocol 2+)."""
    if path.name.lower().endswith(SNAPSHOT_SUFFIXES):
        return True
    try:
        with path.open("rb") as f:
            return f.read(1) == bytes([PICKLE_PROTO])
    except OSError:
        return False


def read_snapshot(path: str | Path) -> Snapshot:
    """Read the snapshot at ``path``; raise :class:`InputError` for anything unusable."""
    path = Path(path)
    with paused_gc():
        data, pickle_bytes = load_pickle_bytes(path)
        return parse_snapshot(data, str(path), pickle_bytes)


@dataclass(frozen=True)
class SnapshotParts:
    """The top level of an unpickled snapshot, checked: what every reader of it shares."""

    segments: list[Segment]
    raw_traces: list[list[Any]]  # device -> its entries, unparsed
    settings: dict[str, Any]
    state_only_list: bool  # the bare segment list of torch.cuda.memory_snapshot()
    legacy: bool  # 2.0 blocks with history
    warnings: list[str]

    def layout(self, timed: bool) -> str:
        if self.state_only_list:
            return "segment list from torch.cuda.memory_snapshot() (state only, no trace)"
        if self.legacy:
            return "PyTorch 2.0 snapshot (blocks carry history)"
        if self.settings:
            return "PyTorch snapshot with allocator_settings (2.5 or later)"
        if timed:
            return "PyTorch snapshot (2.1 or later)"
        return "PyTorch snapshot without timestamps (2.0/2.1)"

    def expandable(self) -> bool:
        """Whether the allocator ran with expandable segments: as ``allocator_settings`` records
        it; a snapshot without that record (before PyTorch 2.5) tells by its segments. The
        setting can be toggled at run time, so a recorded ``False`` beside expandable segments
        is no contradiction: those segments still split as expandable ones, the others do not."""
        if "expandable_segments" in self.settings:
            return bool(self.settings["expandable_segments"])
        return any(s.expandable for s in self.segments)

    def divisions(self) -> dict[int, int]:
        divisions, _ = _divisions(self.settings.get("roundup_power2_divisions"))
        return divisions


def snapshot_parts(
    data: Any, path: str, file_bytes: int | None, taken: Mapping[int, int] | None = None
) -> SnapshotParts:
    """Check the top level and the segments; bound the expansion against ``file_bytes``.
    ``taken``: entries already taken out of trace lists (by the list's id), counted too."""
    shape = _Shape(path)
    limit = ExpansionLimit.for_file(path, file_bytes) if file_bytes is not None else None
    if isinstance(data, list):
        if limit is not None:
            limit.check(_blocks_in(data), "segments and blocks")
        segments = [shape.segment(s, f"[{i}]") for i, s in enumerate(data)]
        return SnapshotParts(_sorted(segments), [], {}, True, False, [])
    if not isinstance(data, dict) or "segments" not in data:
        kind = _a(data)
        raise InputError(
            f"{path}: a pickle of {kind}, not a PyTorch memory snapshot (a dict with"
            " 'segments' and 'device_traces'); write one with torch.cuda.memory._dump_snapshot()"
        )
    raw_segments = shape.list_of(data["segments"], "segments")
    raw_traces = shape.list_of(data.get("device_traces", []), "device_traces")
    traces = [shape.list_of(raw, f"device_traces[{d}]") for d, raw in enumerate(raw_traces)]
    if limit is not None:
        limit.check(_blocks_in(raw_segments), "segments and blocks")
        entries = sum(map(len, traces))
        if taken:
            entries += sum(taken.get(id(t), 0) for t in traces)
        limit.check(entries, "trace entries")
    segments = [shape.segment(s, f"segments[{i}]") for i, s in enumerate(raw_segments)]
    settings = data.get("allocator_settings")
    settings = settings if isinstance(settings, dict) else {}
    legacy = any(
        "history" in b and "address" not in b
        for s in raw_segments
        for b in s.get("blocks", [])
        if isinstance(b, dict)
    )
    _, warnings = _divisions(settings.get("roundup_power2_divisions"))
    return SnapshotParts(_sorted(segments), traces, settings, False, legacy, warnings)


def _blocks_in(raw_segments: list[Any]) -> int:
    """Segments plus their blocks, counted without walking the blocks."""
    return len(raw_segments) + sum(
        len(s["blocks"])
        for s in raw_segments
        if isinstance(s, dict) and isinstance(s.get("blocks"), list)
    )


def parse_snapshot(data: Any, path: str, file_bytes: int | None = None) -> Snapshot:
    """Typed records from an unpickled snapshot (or the list ``memory_snapshot()`` returns);
    ``file_bytes`` (the pickle's size) bounds how far its memo may expand it."""
    parts = snapshot_parts(data, path, file_bytes)
    if parts.state_only_list:
        return Snapshot(path, parts.layout(False), parts.segments, {})
    histories: dict[int, list[HistoryEntry]] = {}
    unknown: Counter[str] = Counter()
    skipped = 0
    sites: dict[int, str] = {}  # id(frames) -> site: a stack shared through the memo, once
    for device, entries in enumerate(parts.raw_traces):
        history = []
        for index, entry in enumerate(entries):
            try:
                parsed = _history_entry(entry, device, index, sites)
            except BadField as err:
                raise InputError(f"{path}: not a usable PyTorch memory snapshot: {err}") from None
            if isinstance(parsed, HistoryEntry):
                history.append(parsed)
            elif parsed:
                unknown[parsed] += 1
            else:
                skipped += 1
        histories[device] = history
    timed = any(e.time_us is not None for h in histories.values() for e in h)
    times = [e.time_us for h in histories.values() for e in h if e.time_us is not None]
    return Snapshot(
        path=path,
        layout=parts.layout(timed),
        segments=parts.segments,
        histories=histories,
        allocator_conf=_str_or_none(parts.settings.get("PYTORCH_CUDA_ALLOC_CONF")),
        max_split_size=_max_split_size(parts.settings.get("max_split_size")),
        roundup_power2_divisions=parts.divisions(),
        expandable_segments=parts.expandable(),
        unknown_actions=unknown,
        skipped_entries=skipped,
        time_origin_us=min(times) if times else None,
        warnings=parts.warnings,
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
        if outside_torch(filename):
            return _frame_text(frame)
    if first_python is not None:
        return _frame_text(first_python)
    for frame in frames:
        name = frame.get("name") if isinstance(frame, dict) else None
        m = _AUTOGRAD_NODE.search(name) if isinstance(name, str) else None
        if m:
            return f"autograd {m.group(1)}"
    return NO_PYTHON_FRAME


def _frame_text(frame: dict[str, Any]) -> str:
    return frame_text(str(frame.get("filename", "")), _plain(frame.get("line", "?")),
                      _plain(frame.get("name", "?")))  # fmt: skip


def frame_text(filename: str, line: str, name: str) -> str:
    """``dir/file.py:line function``: the last two path components, enough to tell model.py
    files apart, short enough to read. A text over FRAME_CHARS keeps its end, after "…": a
    hostile pickle may name a megabyte-long file from every frame."""
    parts = re.split(r"[\\/]", filename[-FRAME_CHARS:])
    text = f"{'/'.join(p for p in parts[-2:] if p)}:{line[:FRAME_CHARS]} {name[:FRAME_CHARS]}"
    return text if len(text) <= FRAME_CHARS else "…" + text[-(FRAME_CHARS - 1) :]


def outside_torch(filename: str) -> bool:
    """A Python frame of the program (not of torch/ itself)."""
    return filename.endswith(".py") and not _TORCH_DIR.search(filename)


def _plain(value: object) -> str:
    """A frame's line or name as text; anything but a string or a 64-bit integer is '?' (a
    hostile value must not cost a recursive repr or a 5,000-digit conversion)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and -INT64 <= value < INT64:
        return str(value)
    return "?"


def entry_fields(entry: object, device: int, index: int) -> tuple[Any, ...] | str | None:
    """``(action, address, size, stream, time_us, device_free, frames)`` of a trace entry, or
    its action name when the action is unknown, or None when it is malformed (skipped); raises
    :class:`BadField` for a value no snapshot can hold (a time beyond 2**53 us, a 70-bit
    stream). ``frames`` is kept only for the actions whose stack names a site."""
    if not isinstance(entry, dict):
        return None
    action = entry.get("action")
    if not isinstance(action, str):
        return None
    if action not in KNOWN_ACTIONS:
        return action
    size = entry.get("size", 0)
    address = 0 if action in ("oom", "snapshot") else entry.get("addr")
    if not (_is_int(address) and _is_int(size)) or not (
        0 <= address < MAX_INT and 0 <= size < MAX_INT
    ):
        return None
    stream = entry.get("stream", 0)
    if not _is_int(stream):
        stream = 0
    elif not -INT64 <= stream < INT64:
        where = f"device_traces[{device}][{index}].stream"
        raise BadField(where, f"is {describe(stream)}, not a CUDA stream")
    time_us = entry.get("time_us")
    if not _is_int(time_us):
        time_us = None
    elif not -MAX_TIME_US <= time_us < MAX_TIME_US:
        raise BadField(
            f"device_traces[{device}][{index}].time_us",
            f"is {describe(time_us)}, not a time in microseconds since the epoch",
        )
    device_free = None
    if action == "oom" and _is_int(free := entry.get("device_free")):
        if not 0 <= free < MAX_INT:
            where = f"device_traces[{device}][{index}].device_free"
            raise BadField(where, f"is {describe(free)}, not a byte count")
        device_free = int(free)
    frames = entry.get("frames") if action in SITE_ACTIONS else None
    return action, int(address), int(size), int(stream), time_us, device_free, frames


def _history_entry(
    entry: object, device: int, index: int, sites: dict[int, str]
) -> HistoryEntry | str | None:
    """The entry, or its action name when the action is unknown, or None when malformed."""
    fields = entry_fields(entry, device, index)
    if not isinstance(fields, tuple):
        return fields
    action, address, size, stream, time_us, device_free, frames = fields
    site = NO_STACK
    if action in SITE_ACTIONS:
        site = sites.get(id(frames)) if frames is not None else None  # type: ignore[assignment]
        if site is None:
            site = sites[id(frames)] = site_of(frames)
    return HistoryEntry(action, address, size, stream, time_us, site, device_free)


class _Shape:
    """Checks the parts of the pickle the model needs; one clear line for what is wrong."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sites: dict[int, str] = {}  # id(frames) -> site: a shared stack is walked once

    def site(self, frames: object) -> str:
        site = self.sites.get(id(frames))
        if site is None:
            site = self.sites[id(frames)] = site_of(frames)
        return site

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

    def stream(self, seg: dict[str, Any], where: str) -> int:
        value = seg.get("stream")
        if not _is_int(value):
            return 0
        if not -INT64 <= value < INT64:
            raise self.fail(f"{where}.stream", f"is {describe(value)}, not a CUDA stream")
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
            raw_state = b.get("state")
            state = _BLOCK_STATES.get(raw_state) if isinstance(raw_state, str) else None
            if state is None:
                raise self.fail(f"{bw}.state", f"is {describe(raw_state)}, not a block state")
            if state == INACTIVE:
                continue
            requested, frames = _requested_and_frames(b, size)
            if not 0 <= requested < MAX_INT:
                raise self.fail(f"{bw}.requested_size", f"is {describe(requested)}, out of range")
            blocks.append(Block(start, size, requested, state == PENDING_FREE, self.site(frames)))
        segment_type = seg.get("segment_type")
        return Segment(
            device=self.integer(seg, "device", where, default=0),
            address=address,
            size=total,
            stream=self.stream(seg, where),
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


def describe(value: object) -> str:
    """A value for a one-line message: short strings and integers as they are, anything else
    (a 5,000-digit integer, a 100,000-deep list) by its kind, never by a full repr."""
    if _is_int(value):
        small = -(10**20) < value < 10**20
        return str(value) if small else f"an integer of {value.bit_length()} bits"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "…")
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    return _a(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _max_split_size(value: object) -> int | None:
    # SIZE_MAX (unlimited) arrives as -1 or 2**63-1 after the int64 cast.
    if not _is_int(value) or value <= 0 or value >= (1 << 62):
        return None
    return int(value)


MAX_DIVISIONS = 1 << 20  # PyTorch takes a power of two; anything larger rounds nothing more


def _divisions(value: object) -> tuple[dict[int, int], list[str]]:
    """``roundup_power2_divisions`` as {interval start in MiB: divisions}, and a warning for
    each entry ignored: keys and values that are not integers in range (``inf``, 2**100)."""
    if not isinstance(value, dict):
        return {}, []
    out = {}
    ignored = []
    for k, v in value.items():
        key = _small_int(k, MAX_INT)
        count = _small_int(v, MAX_DIVISIONS + 1)
        if key is None or key < 1 or count is None or count < 0:
            ignored.append(f"{describe(k)}: {describe(v)}")
            continue
        out[key] = count
    if not ignored:
        return out, []
    warning = (
        f"allocator_settings.roundup_power2_divisions: ignored {len(ignored)} entr"
        f"{'y' if len(ignored) == 1 else 'ies'} that are not an interval start in MiB and a"
        f" division count ({', '.join(ignored[:3])}{', …' if len(ignored) > 3 else ''}); sizes"
        " in those intervals are rounded as without divisions"
    )
    return out, [warning]


def _small_int(value: object, limit: int) -> int | None:
    """An int (or the text of one, as PyTorch writes the keys) below ``limit``; else None."""
    if isinstance(value, str) and len(value) <= 24:
        try:
            value = int(value)
        except ValueError:
            return None
    if _is_int(value) and -limit < value < limit:
        return int(value)
    return None


def describe_actions(counts: Counter[str], limit: int = 5) -> str:
    """``foo ×3, bar ×1`` for a warning."""
    items: Sequence[tuple[str, int]] = counts.most_common(limit)
    text = ", ".join(f"{describe(name)} ×{n}" for name, n in items)
    return text + (", …" if len(counts) > limit else "")
