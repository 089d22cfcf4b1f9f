"""Ranks as tasks on an existing dask.distributed cluster (``--scheduler``, a scheduler file).

Only the task goes over the wire — a path and the options — and only the rank's JSON document
comes back: the workers read the inputs themselves, so they must see the same files at the
same paths (a shared filesystem) and have nsysfrag installed. Relative paths are sent as the
coordinator's absolute paths and named back as given. A worker that dies is the scheduler's
to retry (``distributed.scheduler.allowed-failures``, 3 by default); a rank it gives up on is
reported as failed, and the job goes on.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nsysfrag import limits
from nsysfrag.checks.documents import scheduler_address
from nsysfrag.errors import InputError
from nsysfrag.job.pool import Progress
from nsysfrag.job.worker import RankOutcome, RankTask, analyze_rank, failed

ENV_ADDRESS = "DASK_SCHEDULER_ADDRESS"


def run_on_cluster(
    tasks: Sequence[RankTask],
    address: str | None,
    scheduler_file: Path | None = None,
    progress: Progress | None = None,
    connected: Callable[[], None] | None = None,
) -> list[RankOutcome]:
    """Every task's outcome, run on the cluster whose scheduler is at ``address`` (or named in
    ``scheduler_file``); ``connected`` is called once the scheduler answered."""
    require_dask()
    from distributed import Client, as_completed

    client = _connect(Client, address, scheduler_file)
    if connected is not None:
        connected()
    cwd = os.getcwd()
    job = uuid.uuid4().hex[:8]
    sent = [replace(t, cwd=cwd) for t in tasks]
    with client:
        futures = client.map(
            analyze_rank, sent, key=[f"nsysfrag-{job}-rank-{t.rank}" for t in sent], pure=False
        )
        by_key = {f.key: t for f, t in zip(futures, sent)}
        outcomes: list[RankOutcome] = []
        try:
            if progress is not None:
                progress(0, len(sent))
            for future in as_completed(futures):  # type: ignore[no-untyped-call]
                task = by_key[future.key]
                outcomes.append(_outcome(future, task))
                future.release()  # the document is ours now: the cluster need not keep it
                if progress is not None:
                    progress(len(outcomes), len(sent))
        except BaseException:  # Ctrl-C, SIGTERM: take our tasks off the cluster
            client.cancel(futures, force=True)
            raise
    return outcomes


def require_dask() -> None:
    """InputError unless dask.distributed can be imported (it is an optional extra)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise InputError(
            "--scheduler runs the job on dask.distributed, which is not installed here; pip install"
            " 'nsysfrag[dask]' (on every worker too), or leave out --scheduler for the local pool"
        ) from None


def _connect(client: Any, address: str | None, scheduler_file: Path | None) -> Any:
    """A client of the scheduler at ``address`` or named in ``scheduler_file`` (read and
    checked here, ``checks.documents``), trying for at most ``limits.DASK_CONNECT_S``."""
    if scheduler_file is not None:
        address = scheduler_address(scheduler_file)
        where = f"{address} (from {scheduler_file})"
    else:
        where = str(address)
    timeout_s = limits.DASK_CONNECT_S.value()
    try:
        return client(address, timeout=timeout_s)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(
            f"cannot reach the Dask scheduler at {where} ({reason[:300]}); check that it is running"
            f" and the address is right (nsysfrag tries for {timeout_s:g} s:"
            f" {limits.DASK_CONNECT_S.env})"
        ) from None


def _outcome(future: Any, task: RankTask) -> RankOutcome:
    if future.status == "finished":
        outcome: RankOutcome = future.result()
        return outcome
    if future.status == "cancelled":
        return failed(task.rank, task.path, "the Dask cluster cancelled its task")
    err = future.exception()
    if type(err).__name__ == "KilledWorker":
        return failed(
            task.rank, task.path,
            "the Dask workers running it died each time it was tried; it may need more memory"
            " than a worker has: analyze it alone",
        )
    if isinstance(err, (ModuleNotFoundError, ImportError)):
        return failed(
            task.rank, task.path,
            f"a Dask worker could not load nsysfrag ({err}); install nsysfrag on every worker",
        )
    return failed(task.rank, task.path, f"its Dask task failed: {type(err).__name__}: {err}")
