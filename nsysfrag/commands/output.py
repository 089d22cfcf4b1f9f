"""What every command does with the files it writes: check them before the work, write them
after; ``-`` is stdout."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click

from nsysfrag.errors import InputError
from nsysfrag.inputs.files import stat_path

STDOUT = Path("-")


def check_output_paths(
    paths: Iterable[Path], source: Path | None = None, *, folders: bool = False
) -> None:
    """Fail before any work when an output would overwrite ``source`` (the input) or, unless
    the outputs are ``folders`` (made when missing), has no folder to go in."""
    for path in paths:
        stat_path(path, "choose a shorter one")  # a name the file system refuses to look up
        if path == STDOUT and not folders:
            continue
        if (
            source is not None
            and path.exists()
            and source.exists()
            and path.resolve() == source.resolve()
        ):
            raise InputError(f"{path}: refusing to overwrite the input; choose another path")
        if not folders and not path.parent.exists():
            raise InputError(f"{path}: folder {path.parent} does not exist; create it first")


def write_text(path: Path, text: str) -> None:
    """Write a text report to ``path``, or to stdout for ``-``."""
    if path == STDOUT:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None
