"""What the recorder and nsysfrag agree on: the environment that arms the recorder and the
files of a record folder.

A record folder ``OUT`` holds ``record.json`` (written by ``nsysfrag record``: the command,
when, how it ended), ``processes.jsonl`` (a line per Python process that ran the bootstrap, and
per step it reached: torch imported, CUDA initialized, a recorder error) and one folder per
process that used CUDA, named by the first rule that names it: ``rank{R}`` for the launcher's
rank R (``$RANK`` and the like; ``rank{R}-attempt{A}`` for torchrun's restart A of it), else
``rank{D}`` for the one CUDA device D it used (``mp.spawn``'s ``set_device(rank)``), else
``pid{P}``; ``rank{R}-pid{P}`` is a second process of launcher rank R (a helper):

- ``process.json``: who the process was (rank, world size, host, pid, torch) and its devices;
- ``timeline.jsonl``: a line per device per sample (``memory_stats()``, ``mem_get_info()``,
  the sample's own cost) and a line per out-of-memory the allocator reported;
- ``steps.jsonl``: where the program calls ``nsysfrag.torch.monitor().step()``, a line at
  each step that samples (the step's number and time: the time per step);
- ``oom-{k}.pickle``: the snapshot at the k-th out-of-memory; ``final.pickle``: at exit;
  ``state-{n}.pickle``: the newest state-only snapshot (``torch.cuda.memory_snapshot()``);
- beside each snapshot ``X.pickle``, ``X.device.json``: the device facts a snapshot lacks.
"""

from __future__ import annotations

ENV_DIR = "NSYSFRAG_RECORD_DIR"  # the record folder, absolute; unset: the bootstrap does nothing
ENV_OPTIONS = "NSYSFRAG_RECORD_OPTIONS"  # JSON: see options.Options

MARKER = "record.json"
PROCESSES = "processes.jsonl"
RANK_PREFIX = "rank"
PID_PREFIX = "pid"
ATTEMPT_INFIX = "-attempt"
HOST_MARKER_PREFIX = "record-"  # record-{host}.json: a second host's run into the same folder
# How a process got its folder's name (process.json's "named_by", beside the variable's name).
BY_DEVICE = "device"
BY_PID = "pid"
PROCESS = "process.json"
TIMELINE = "timeline.jsonl"
STEPS = "steps.jsonl"  # a line per monitor().step() that sampled: the step count and its time
FINAL = "final.pickle"
OOM_PREFIX = "oom-"
STATE_PREFIX = "state-"
SNAPSHOT_SUFFIX = ".pickle"
FACTS_SUFFIX = ".device.json"

RECORD_SCHEMA = "nsysfrag-record/1"
FACTS_SCHEMA = "nsysfrag-record-facts/1"
TIMELINE_SCHEMA = "nsysfrag-record-timeline/1"


def facts_name(snapshot_name: str) -> str:
    """``final.pickle`` -> ``final.device.json``."""
    # Not str.removesuffix: the program may run Python 3.8.
    suffix = snapshot_name.endswith(SNAPSHOT_SUFFIX)
    stem = snapshot_name[: -len(SNAPSHOT_SUFFIX)] if suffix else snapshot_name
    return stem + FACTS_SUFFIX


def oom_name(k: int) -> str:
    return f"{OOM_PREFIX}{k}{SNAPSHOT_SUFFIX}"


def state_name(n: int) -> str:
    return f"{STATE_PREFIX}{n}{SNAPSHOT_SUFFIX}"


def numbered(name: str, prefix: str) -> int | None:
    """``oom-3.pickle`` with prefix ``oom-`` -> 3; None for any other name."""
    if not (name.startswith(prefix) and name.endswith(SNAPSHOT_SUFFIX)):
        return None
    digits = name[len(prefix) : -len(SNAPSHOT_SUFFIX)]
    return int(digits) if digits.isdigit() and len(digits) < 10 else None
