"""A pickle reader that builds plain containers and scalars only.

PyTorch snapshots are pickled dicts of lists, ints, strings and floats. Anything that asks the
unpickler to import a name is refused, except the three harmless names real snapshots use
(``collections.OrderedDict``, ``collections.defaultdict`` and ``_codecs.encode``, which old
pickles use to write bytes).
"""

from __future__ import annotations

import codecs
import collections
import io
import pickle
from pathlib import Path
from typing import Any

_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("_codecs", "encode"): codecs.encode,
}


class RefusedPickle(Exception):
    """The pickle references something other than plain data."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise RefusedPickle(f"pickle references {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("pickle uses persistent ids")


def load_plain(path: str | Path) -> Any:
    data = Path(path).read_bytes()
    return _PlainUnpickler(io.BytesIO(data)).load()
