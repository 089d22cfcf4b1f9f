"""``nsysfrag whatif INPUT``: replay a run's allocations through other allocators."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.console import Console

from nsysfrag.allocators import DEFAULT_POLICIES, parse_policy
from nsysfrag.commands.report_options import STDOUT, ByteSize
from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import runner as nsys


def _write(path: Path, text: str) -> None:
    if path == STDOUT:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None


def _check_outputs(paths: list[Path], source: Path) -> None:
    for path in paths:
        if path == STDOUT:
            continue
        if path.exists() and source.exists() and path.resolve() == source.resolve():
            raise InputError(f"{path}: refusing to overwrite the input; choose another path")
        if not path.parent.exists():
            raise InputError(f"{path}: folder {path.parent} does not exist; create it first")


@click.command("whatif")
@click.argument("source", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("--policy", "policies", multiple=True, metavar="POLICY",
              help="A policy to replay (repeatable; default: all of "
              + ", ".join(DEFAULT_POLICIES) + "). torch takes PYTORCH_CUDA_ALLOC_CONF options:"
              " torch:expandable_segments=True,max_split_size_mb=128.")  # fmt: skip
@click.option("--capacity", type=ByteSize(), default=None,
              help="Device memory to simulate (e.g. 80GiB). Default: the trace's GPU; for a"
              " snapshot, what its recorded OOM implies, else 80 GiB.")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the JSON report here ('-' for stdout).")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Write a self-contained HTML report (works offline).")
@click.option("--validate", is_flag=True,
              help="Snapshots: replay the recorded requests through the torch model with the"
              " snapshot's settings and compare with the recorded segment allocations.")  # fmt: skip
@click.option("-q", "--quiet", is_flag=True, help="Print no terminal report.")
def whatif_command(
    source: Path,
    policies: tuple[str, ...],
    capacity: int | None,
    json_path: Path | None,
    html_path: Path | None,
    validate: bool,
    quiet: bool,
) -> None:
    """Replay a run's allocations through other allocators and recommend the fix.

    INPUT is a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot; its alloc and
    free_completed entries, with their streams) or an nsys export (.sqlite, or .nsys-rep, which
    nsys exports first): every policy replays the same requests on a device of --capacity
    bytes, and the report ranks them by simulated OOMs and peak reserved memory and says what
    to set.

    Example:

    \b
        nsysfrag whatif snap.pickle
        nsysfrag whatif run.sqlite --policy torch:expandable_segments=True \\
            --policy torch:max_split_size_mb=128 --policy best-fit --capacity 80GiB \\
            --html whatif.html --json whatif.json
        nsysfrag whatif snap.pickle --validate --json -
    """
    from nsysfrag.reporters import whatif_report
    from nsysfrag.whatif import whatif

    for p in policies:
        parse_policy(p)  # a bad --policy fails before any work
    outputs = [p for p in (json_path, html_path) if p is not None]
    _check_outputs(outputs, source)
    if nsys.is_report(source):
        from nsysfrag.commands.analyze import export_report

        source = export_report(source, None, None, False)
    report = whatif(source, policies, capacity, validate)
    for space in report.spaces:
        for w in space.warnings:
            click.echo(f"nsysfrag: warning: {space.label}: {w}", err=True)
    if json_path is not None:
        _write(json_path, whatif_report.dumps(whatif_report.document(report)))
    if html_path is not None:
        _write(html_path, whatif_report.render_html(report))
    if not quiet and STDOUT not in (json_path, html_path):
        console = Console(width=int(os.environ.get("NSYSFRAG_WIDTH", "0")) or None, soft_wrap=False)
        whatif_report.render_terminal(report, console)
