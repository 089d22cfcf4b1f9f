"""``nsysfrag record --try SETTING ... -- COMMAND``: the round (``nsysfrag.trial``) from the
command line: every check before the first run, the runs, then the table, the verdict, the
``nsysfrag-try/1`` document (``OUT/try.json``, and ``--json``), ``--html`` and the gates."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsysfrag.errors import InputError
from nsysfrag.pipeline.feedback import say, say_tripped
from nsysfrag.pipeline.request import ReportRequest
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
from nsysfrag.trial.measure import RankFigures
from nsysfrag.trial.predict import Predictions
from nsysfrag.trial.rounds import RunOutcome
from nsysfrag.trial.settings import TrySetting

if TYPE_CHECKING:
    from nsysfrag.trial.compare import Measured


@dataclass(frozen=True, slots=True)
class TryRequest:
    tries: tuple[str, ...]
    duration_s: float | None
    repeats: int
    overwrite: bool
    alert_command: str | None


def check_try_request(request: ReportRequest, tries: TryRequest) -> tuple[list[TrySetting], bool]:
    """Every --try parsed and the options that make no sense with it refused: one line each,
    before anything runs."""
    from nsysfrag.trial.settings import parse_tries

    if request.baseline is not None:
        raise InputError("--baseline compares one job with another; with --try the baseline is"
                         " the command's own first run (drop --baseline)")  # fmt: skip
    if request.record:
        raise InputError("--record stores one run in the history; with --try, record the run of"
                         " the setting you keep on its own (drop --record)")  # fmt: skip
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "").strip() == "1":
        raise InputError("--try: PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns the caching allocator off,"
                         " and with it every setting; unset it to compare settings")  # fmt: skip
    return parse_tries(tries.tries)


@dataclass
class _Baseline:
    """What the round learns from its first baseline run."""

    conf: str
    policies: dict[str, str] = field(default_factory=dict)  # setting → whatif policy
    predictions: dict[int, Predictions] = field(default_factory=dict)
    figures: list[RankFigures] | None = None
    notes: list[str] = field(default_factory=list)


def run_try(
    command: tuple[str, ...],
    out: Path,
    request: ReportRequest,
    tries: TryRequest,
    options: Options,
) -> int:
    """The round, its reports and gates; the exit code (1 for a tripped gate, the baseline's
    own failure else, 0)."""
    from nsysfrag.pipeline.outputs import Kept, check_destinations
    from nsysfrag.commands.profile import check_program
    from nsysfrag.trial import rounds
    from nsysfrag.trial.settings import already_set, program_conf

    settings, auto = check_try_request(request, tries)
    check_program(command)
    variable, conf = program_conf(os.environ)
    already_set(settings, conf, f"in ${variable}")
    check_destinations(request.outputs(), [Kept("the round's folder", out)], None)
    rounds.prepare_round(out, tries.overwrite)
    state = _Baseline(conf)

    def after_baseline(run: RunOutcome) -> tuple[list[TrySetting], list[tuple[str, str]]]:
        return _after_baseline(run, settings, auto, state, request.granularity)

    the_round = rounds.run_round(
        command, out, settings, tries.repeats, tries.duration_s, options, os.environ, variable,
        2 if request.uses_stdout() else None, say, after_baseline, tries.alert_command,
    )  # fmt: skip
    measured = [_measured(run, state, request.granularity) for run in the_round.runs]
    from nsysfrag.trial.compare import round_document
    from nsysfrag.trial.rounds import ROUND_DOCUMENT, environment_conf

    doc = round_document(
        command, the_round, measured, state.predictions, state.policies, tries.duration_s,
        tries.repeats, environment_conf(os.environ), state.notes,
    )  # fmt: skip
    code = _report(doc, measured, request, out / ROUND_DOCUMENT)
    last = the_round.runs[-1] if the_round.runs else None
    if the_round.stopped and last is not None and last.received is not None:
        import signal

        say(f"{signal.Signals(last.received).name} received; the round stopped after"
            f" {len(the_round.runs)} run{'s' if len(the_round.runs) != 1 else ''}, the table"
            " shows what they recorded")  # fmt: skip
        return 128 + last.received
    return code


def _after_baseline(
    run: RunOutcome, settings: list[TrySetting], auto: bool, state: _Baseline, granularity: int
) -> tuple[list[TrySetting], list[tuple[str, str]]]:
    """The program's own settings as its processes saw them, the settings ``auto`` adds, and
    the baseline's what-if for each setting kept."""
    from nsysfrag.trial.predict import predict, recommended_confs
    from nsysfrag.trial.rounds import conf_seen
    from nsysfrag.trial.settings import conf_keys, settings_from_conf

    state.figures = _figures(run.plan.folder, granularity)
    ours = conf_keys(run.conf)
    for rank, seen in sorted(conf_seen(run.plan.folder).items()):
        if conf_keys(seen) != ours:  # the program set the allocator's options itself
            state.conf = seen
            state.notes.append(f"rank {rank} set PYTORCH_CUDA_ALLOC_CONF={seen!r} itself")
            break
    own = conf_keys(state.conf)
    refused = [(str(s), f"the program sets {s.key}:{own[s.key]} itself")
               for s in settings if s.key in own]  # fmt: skip
    chosen = [s for s in settings if s.key not in own]
    snapshots = [(f.rank, f.snapshot) for f in state.figures if f.snapshot is not None]
    if auto:
        found: list[TrySetting] = []
        for rank, snapshot in snapshots:
            confs, problem = recommended_confs(snapshot)
            if problem:
                state.notes.append(f"--try auto: whatif on rank {rank}'s baseline: {problem}")
            for c in confs:
                found += [s for s in settings_from_conf(c, state.conf) if s not in found]
        added = [s for s in found if all(s.key != c.key for c in chosen)]
        chosen += added
        state.notes.append(
            "--try auto: whatif on the baseline's snapshots "
            + (f"suggests {', '.join(map(str, added))}" if added else "suggests no setting to try")
        )
        say(state.notes[-1])
    state.policies = {str(s): s.policy(state.conf) for s in chosen}
    if snapshots and chosen:
        say(f"whatif: replaying the baseline's snapshot{'s' if len(snapshots) > 1 else ''} under"
            f" {len(chosen)} setting{'s' if len(chosen) > 1 else ''}")  # fmt: skip
    for rank, snapshot in snapshots:
        state.predictions[rank] = predict(snapshot, list(state.policies.values()), rank)
        if state.predictions[rank].error:
            state.notes.append(f"no what-if for rank {rank}: {state.predictions[rank].error}")
    return chosen, refused


def _figures(folder: Path, granularity: int) -> list[RankFigures]:
    from nsysfrag.trial.measure import measure_run

    return measure_run(folder, granularity)


def _measured(run: RunOutcome, state: _Baseline, granularity: int) -> Measured:
    from nsysfrag.record.why import nothing_recorded
    from nsysfrag.trial.compare import Measured

    first_baseline = run.plan.setting is None and run.plan.repeat == 1
    ranks = state.figures if first_baseline and state.figures is not None else None
    if ranks is None:
        ranks = _figures(run.plan.folder, granularity)
    recorded = any(r.snapshot is not None for r in ranks)
    return Measured(run, ranks, None if recorded else nothing_recorded(run.plan.folder),
                    _overridden(run))  # fmt: skip


def _overridden(run: RunOutcome) -> str | None:
    """What a rank saw instead of the run's setting, when the program replaced it."""
    from nsysfrag.trial.rounds import conf_seen
    from nsysfrag.trial.settings import conf_keys

    s = run.plan.setting
    if s is None:
        return None
    for rank, seen in sorted(conf_seen(run.plan.folder).items()):
        if conf_keys(seen).get(s.key) != s.value:
            return f"rank {rank} saw PYTORCH_CUDA_ALLOC_CONF={seen!r}"
    return None


def _report(
    doc: dict[str, Any], measured: Sequence[Measured], request: ReportRequest, kept_at: Path
) -> int:
    from nsysfrag import destinations
    from nsysfrag.checks.gates import evaluate
    from nsysfrag.pipeline.outputs import report_console, write_text
    from nsysfrag.trial import html, terminal

    text = json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=False) + "\n"
    destinations.write_text(kept_at, text, "-o")
    for (r, _), output in zip(request.reports, request.outputs(), strict=True):
        if r.name == "json":
            write_text(output, text)
        elif r.name == "html":
            write_text(output, html.render(doc))
        else:
            raise InputError(f"{output.option}: with --try the reports are --json and --html")
    if request.to_screen():
        terminal.render(doc, report_console())
    keep = doc["verdict"]["keep"]
    judged = [m for m in measured if m.outcome.plan.label == (keep or "baseline")]
    trips = (
        f"{m.outcome.plan.label}: {trip.message(rank=r.rank)}"
        for m in judged
        for r in m.ranks
        if r.document is not None
        for trip in evaluate(list(request.gates), r.document)
    )
    code = say_tripped(trips)
    if code:
        return code
    first = next((r for r in doc["runs"] if r["setting"] == "baseline"), None)
    if first is not None and first["ended"] == "exit" and first["exit_code"]:
        say(f"the command exited with code {first['exit_code']} in its baseline run")
        return int(first["exit_code"])
    return 0
