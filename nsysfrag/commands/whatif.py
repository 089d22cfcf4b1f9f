"""``nsysfrag whatif INPUT``: replay a run's allocations through other allocators."""

from __future__ import annotations

from pathlib import Path

import click

from nsysfrag.allocators import DEFAULT_POLICIES, DRIVER_REMEDIES, parse_policy
from nsysfrag.commands.params import ByteSize
from nsysfrag.inputs.files import check_regular_file
from nsysfrag.inputs.nsys import is_report
from nsysfrag.pipeline.feedback import feedback, say
from nsysfrag.pipeline.outputs import Kept, Output, check_destinations, report_console, write_text


@click.command("whatif")
@click.argument("source", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("--policy", "policies", multiple=True, metavar="POLICY",
              help="A policy to replay (repeatable). Default for a snapshot: all of "
              + ", ".join(DEFAULT_POLICIES) + ", and torch with each setting the input"
              " suggests added to the run's own: expandable_segments, max_split_size_mb at"
              " the sizes of its large blocks, garbage_collection_threshold,"
              " roundup_power2_divisions, unless the run set it or it conflicts. Default for"
              " an nsys trace of a program calling cudaMalloc directly: the remedies "
              + ", ".join(DRIVER_REMEDIES) + " against the recorded driver behaviour (driver);"
              " of a caching allocator's segments, the record alone. torch takes"
              " PYTORCH_CUDA_ALLOC_CONF options:"
              " torch:expandable_segments=True,max_split_size_mb=128; arena takes"
              " size=BYTES.")  # fmt: skip
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
    to set. A snapshot's baseline is its recorded allocator settings; an nsys trace's is what
    the driver did, as analyze reports it.

    Examples:

    \b
        nsysfrag whatif snap.pickle
        nsysfrag whatif run.sqlite --policy torch:expandable_segments=True \\
            --policy torch:max_split_size_mb=128 --policy best-fit --capacity 80GiB \\
            --html whatif.html --json whatif.json
        nsysfrag whatif snap.pickle --validate --json -
    """
    from nsysfrag.reporters import whatif as whatif_report
    from nsysfrag.whatif import whatif

    for p in policies:
        parse_policy(p)  # a bad --policy fails before any work
    check_regular_file(source)  # before anything opens it: a FIFO would block the open
    json_out = Output("--json", json_path) if json_path is not None else None
    html_out = Output("--html", html_path) if html_path is not None else None
    outputs = [o for o in (json_out, html_out) if o is not None]
    check_destinations(outputs, [Kept("the input", source)])
    if is_report(source):
        from nsysfrag.pipeline.single import export_report

        source = export_report(source, None, None, False)
        check_destinations(outputs, [Kept("the input's export", source)])
    with feedback() as shown, shown.compiling("the allocator models"):
        report = whatif(source, policies, capacity, validate)
    terminal = not quiet and not any(o.to_stdout for o in outputs)
    # stderr is one line at most (a CI log greps it), however many spaces have warnings; the
    # terminal report says each under its space, so a shown report is not doubled there.
    warnings = [f"{space.label}: {w}" for space in report.spaces for w in space.warnings]
    if warnings and not terminal:
        say(f"warning: {'; '.join(warnings)}")
    if json_out is not None:
        write_text(json_out, whatif_report.dumps(whatif_report.document(report)))
    if html_out is not None:
        write_text(html_out, whatif_report.render_html(report))
    if terminal:
        whatif_report.render_terminal(report, report_console())
