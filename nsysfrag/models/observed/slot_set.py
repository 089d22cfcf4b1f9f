"""Sets of live slots for the observed replay: which slots are live, and the live slot just
below a given one.

Each set is a row of bits, 32 slots to a word, with a summary level above it (a word's bit is
set while the word below it has any bit set), and so on up to a single word. Adding or removing
a slot writes one word, and a level above only when that word turns empty or non-empty; the
live slot below another is found in a few word operations per level. The Fenwick tree this
replaces spent two walks of log2(slots) dependent steps on every lookup and one on every update
(with 60,000 slots, about 16 each), and the replay does one of each per event.

The replay calls these inlined and without reference counts (see ``kernel._replay_loop``).

Words are int64 holding 32 bits so that every value stays positive: no sign bit and no unsigned
arithmetic (which numba would mix with int64 into float64).
"""

from __future__ import annotations

import numpy as np

from nsysfrag import jit

_SHIFT = 5  # 32 slots to a word
_LOW = 31


@jit.njit(cache=True, nogil=True)
def level_starts(slots):  # type: ignore[no-untyped-def]
    """Where each level's words start in a set's row of ``slots`` slots, lowest level first;
    the last entry is the row's length (the top level is one word)."""
    levels = 1
    words = max(1, (slots + _LOW) >> _SHIFT)
    while words > 1:
        words = (words + _LOW) >> _SHIFT
        levels += 1
    starts = np.zeros(levels + 1, dtype=np.int64)
    words = max(1, (slots + _LOW) >> _SHIFT)
    for level in range(levels):
        starts[level + 1] = starts[level] + words
        words = (words + _LOW) >> _SHIFT
    return starts


@jit.njit(cache=True, nogil=True)
def _high_bit(word):  # type: ignore[no-untyped-def]
    """The index of the highest set bit of ``word`` (0 < word < 2**32)."""
    r = 0
    if word >> 16:
        word >>= 16
        r += 16
    if word >> 8:
        word >>= 8
        r += 8
    if word >> 4:
        word >>= 4
        r += 4
    if word >> 2:
        word >>= 2
        r += 2
    if word >> 1:
        r += 1
    return r


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def set_add(bits, row, starts, slot):  # type: ignore[no-untyped-def]
    """Add ``slot`` to set ``row``."""
    i = slot
    for level in range(len(starts) - 1):
        w = starts[level] + (i >> _SHIFT)
        old = bits[row, w]
        bits[row, w] = old | (1 << (i & _LOW))
        if old != 0:  # the levels above already know this word is non-empty
            break
        i >>= _SHIFT


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def set_remove(bits, row, starts, slot):  # type: ignore[no-untyped-def]
    """Remove ``slot`` (a member) from set ``row``."""
    i = slot
    for level in range(len(starts) - 1):
        w = starts[level] + (i >> _SHIFT)
        left = bits[row, w] & ~(1 << (i & _LOW))
        bits[row, w] = left
        if left != 0:  # the word is still non-empty: nothing above changes
            break
        i >>= _SHIFT


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def set_below(bits, row, starts, slot):  # type: ignore[no-untyped-def]
    """The largest member of set ``row`` below ``slot``, or -1."""
    levels = len(starts) - 1
    i = slot
    level = 0
    while level < levels:
        below = bits[row, starts[level] + (i >> _SHIFT)] & ((1 << (i & _LOW)) - 1)
        if below != 0:
            i = ((i >> _SHIFT) << _SHIFT) + _high_bit(below)
            break
        i >>= _SHIFT
        level += 1
    if level == levels:
        return -1
    # Down again: in each word below, the highest member.
    while level > 0:
        level -= 1
        i = (i << _SHIFT) + _high_bit(bits[row, starts[level] + i])
    return i
