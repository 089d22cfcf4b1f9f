"""How a report made from analysis documents alone (compare) speaks of their input: the words
the analysis used, which the document records, and its clock.

A document records its input and words (``trace.input``, ``trace.words``); one written before
them is told by its model: a pytorch-segments document is a snapshot's, any other an nsys
export's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsysfrag.errors import InputError
from nsysfrag.moments import moment_since

SNAPSHOT_MODEL = "pytorch-segments"


@dataclass(frozen=True, slots=True)
class DocumentWords:
    model: str  # the model that produced the figures
    input: str  # the input format's name, e.g. "torch-snapshot"
    description: str  # "a PyTorch memory snapshot"
    space_title: str  # what one space's figures describe
    input_noun: str  # "snapshot", "trace"
    site_label: str  # "allocation site (stack frame)"
    untimed: str  # a moment of an input without times: "entry 17"


@dataclass(frozen=True, slots=True)
class Clock:
    """A document's time base: its input's first event, and whether times are timestamps."""

    origin_ns: int
    timestamps: bool
    untimed: str
    span_ns: int | None = None  # to the last moment a space states; None: not known

    def at(self, time_ns: int) -> str:
        return moment_since(time_ns, self.origin_ns, self.timestamps, self.untimed, self.span_ns)


def _section(doc: dict[str, Any], key: str) -> dict[str, Any]:
    found = doc.get(key)
    return found if isinstance(found, dict) else {}


def document_words(doc: dict[str, Any]) -> DocumentWords:
    trace = _section(doc, "trace")
    model = str(_section(doc, "model").get("name") or "observed")
    kind = trace.get("input")
    if not isinstance(kind, str):
        kind = "torch-snapshot" if model == SNAPSHOT_MODEL else "nsys-export"
    recorded = _section(trace, "words")
    names = ("space_title", "input_noun", "site_label", "untimed")
    if all(isinstance(recorded.get(n), str) for n in names):
        words = {n: str(recorded[n]) for n in names}
    else:
        fallback = _input_words(kind)
        words = {n: str(getattr(fallback, n)) for n in names}
    return DocumentWords(model=model, input=kind, description=_description(kind), **words)


def clock_of(doc: dict[str, Any]) -> Clock:
    trace = _section(doc, "trace")
    origin = time_origin(doc)
    span = time_span(doc, origin)
    return Clock(origin, bool(trace.get("timestamps", True)), document_words(doc).untimed, span)


def same_model(base: dict[str, Any], current: dict[str, Any], names: tuple[str, str]) -> None:
    """InputError, in one line, unless both documents are of one input kind and one model."""
    b, c = document_words(base), document_words(current)
    if (b.input, b.model) == (c.input, c.model):
        return
    if b.input == c.input:
        raise InputError(
            f"{names[0]} was analyzed in the {b.model} model and {names[1]} in the {c.model}"
            f" model; analyze both the same way, then compare"
        )
    raise InputError(other_kinds(names, (b.description, c.description)))


def other_kinds(names: tuple[str, str], descriptions: tuple[str, str]) -> str:
    """The one-line refusal of two runs of different kinds of input, and what would work."""
    return (
        f"{names[0]} is {descriptions[0]} and {names[1]} {descriptions[1]}: their figures mean"
        " different things; compare two of one kind (two snapshots, two nsys exports)"
    )


def _input_words(kind: str) -> Any:
    if kind == "torch-snapshot":
        from nsysfrag.inputs.torch_snapshot.words import WORDS

        return WORDS
    from nsysfrag.inputs.nsys.words import WORDS as NSYS_WORDS

    return NSYS_WORDS


def _description(kind: str) -> str:
    from nsysfrag.inputs import formats

    found = next((f.description for f in formats() if f.name == kind), None)
    return found if found is not None else f"a {kind} input"


def time_origin(doc: dict[str, Any]) -> int:
    """A rank's time origin: its input's first event, ``trace.first_event_ns``; for a document
    from before that key, the earliest point of its timelines (each holds its space's first
    event)."""
    recorded = doc.get("trace", {}).get("first_event_ns")
    if recorded is not None:
        return int(recorded)
    firsts = [s["timeline"]["time_ns"][0] for s in doc["spaces"] if s["timeline"]["time_ns"]]
    return int(min(firsts, default=0))


def time_span(doc: dict[str, Any], origin_ns: int) -> int | None:
    """From ``origin_ns`` to the last moment a space of ``doc`` states (its final state, its
    worst, what set its health): what the resolution of the rank's times follows; None where no
    space states one."""
    ends = [
        int(s[part]["time_ns"])
        for s in doc.get("spaces", ())
        if isinstance(s, dict)
        for part in ("final", "peak", "health_basis")
        if isinstance(s.get(part), dict) and isinstance(s[part].get("time_ns"), int)
    ]
    return max(ends) - origin_ns if ends else None
