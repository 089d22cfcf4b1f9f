"""The snapshot's opcode pass (``pickle_scan``) on mutated pickles, as a process of its own.

    python -m tests.hostile.pickle_scan_fuzz --cases 100000 --seed 1 FILE.pickle ...

Each case mutates one pickle (bytes overwritten, flipped, deleted, inserted or repeated; the
file cut; opcodes spliced in: a memo index of 2^32, a tuple chain deeper than the limit, marks
left open, a length of 2^63) and runs the pass on it compiled and, for the small pickles,
interpreted. Both must find the same (status, end, deepest tuple, slice ends, each memo slot's
last use); where the pass says the
pickle is whole (OK), pickle's own opcode reader (``pickletools.genops``) must find its STOP at
the same end, or fail only on an argument's text (which the pass leaves to the unpickler).
A mismatch exits 1 with the case on stdout; a crash by signal ends the process, and the test
that starts it (tests/hostile/test_snapshot_fuzz.py) reports it with the last case printed.
"""

from __future__ import annotations

import argparse
import os
import pickletools
import random
import sys
from pathlib import Path

from nsysfrag.inputs.torch_snapshot import pickle_scan

LIMIT = 100  # tuples nested deeper than this are refused (limits.PICKLE_NESTING's role)
SMALL = 16_384  # pickles up to this size also run interpreted (the twin is plain Python)
SLICE = 40  # items a list grows by before the pass marks a slice's end (the reader's: 65,536)
SPLICES = [
    b"j\xff\xff\xff\xff",  # LONG_BINGET 2^32 - 1: a memo beyond the file
    b"h\xff",  # BINGET 255
    b"r\x00\x00\x00\x80",  # LONG_BINPUT 2^31
    b"(" * 300,  # marks left open
    b")" + b"\x85" * 300,  # a tuple nested 300 deep
    b"\x8e" + b"\xff" * 8,  # BINBYTES8 of 2^64 - 1 bytes
    b"\x8d" + b"\x00" * 7 + b"\x80",  # BINUNICODE8 of 2^63
    b"X\xff\xff\xff\x7f",  # BINUNICODE of 2^31 - 1
    b"g999999999999999999999\n",  # GET of a 21-digit index
    b"I12x\n",  # INT whose text is no number
    b".",  # STOP early
    b"\x94" * 50,  # MEMOIZE with little on the stack
    b"\x80\x05",  # PROTO again
    b"\xff",  # no opcode
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            for _ in range(rng.randint(1, 8)):
                out[rng.randrange(len(out))] = rng.randrange(256)
        elif kind == 1 and out:
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif kind == 2:
            del out[at : at + rng.randint(1, 64)]
        elif kind == 3:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 4:
            piece = out[at : at + rng.randint(1, 256)]
            out[at:at] = piece * rng.randint(1, 20)
        elif kind == 5:
            out = out[: rng.randrange(len(out) + 1)]
        else:
            out[at:at] = rng.choice(SPLICES)
    return bytes(out)


def scanned(data: bytes, mode: str) -> tuple[int, int, int, tuple[int, ...], int]:
    """What the pass found, with where it would slice (a list per SLICE items) and a digest
    of each memo slot's last use."""
    os.environ["NSYSFRAG_KERNELS"] = mode
    scanner = pickle_scan.scanned_bytes(data, LIMIT, SLICE)
    found = scanner.result()
    digest = hash(scanner.memo_last_use().tobytes())
    ends = tuple(scanner.slice_ends().tolist())
    return found.status, found.end, found.deepest_tuple, ends, digest


def stop_of(data: bytes) -> int | str:
    """Where pickle's own reader finds the end (just after STOP), or why it stops."""
    try:
        for opcode, _, pos in pickletools.genops(data):
            if opcode.name == "STOP":
                return pos + 1
    except (ValueError, UnicodeDecodeError, OverflowError) as err:
        return f"argument: {err}"
    return "no STOP"


def run(sources: list[Path], first: int, cases: int, seed: int) -> int:
    originals = [s.read_bytes() for s in sources]
    counts: dict[str, int] = {}
    for case in range(first, first + cases):
        print(case, flush=True)
        rng = random.Random(seed * 1_000_003 + case)
        data = mutate(rng, rng.choice(originals))
        compiled = scanned(data, "compiled")
        if len(data) <= SMALL:
            twin = scanned(data, "interpreted")
            if twin != compiled:
                print(f"case {case} (seed {seed}): compiled {compiled}, interpreted {twin}")
                return 1
        status, end = compiled[:2]
        if status == pickle_scan.OK:
            reference = stop_of(data)
            if reference != end and not (isinstance(reference, str) and reference.startswith("argument")):
                print(f"case {case} (seed {seed}): the pass ends at {end}, pickle's reader: {reference}")
                return 1
        name = "ok" if status == pickle_scan.OK else "refused" if status in pickle_scan.REFUSED else "left"
        counts[name] = counts.get(name, 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sources", nargs="+", type=Path)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    return run(args.sources, args.first, args.cases, args.seed)


if __name__ == "__main__":
    sys.exit(main())
