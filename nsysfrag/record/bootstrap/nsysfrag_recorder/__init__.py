"""The recorder ``nsysfrag record`` loads into every Python process of the command.

Standard library only, and torch once the program has imported it: the program's interpreter
may be another than nsysfrag's, without nsysfrag's dependencies, as old as Python 3.8. The
bootstrap's ``sitecustomize`` calls :func:`install`; nothing happens until torch has
initialized CUDA (``hook``), then :class:`~.recorder.Recorder` records the process into the
record folder (``names`` lists its files). No error of the recorder reaches the program: each
is one warning line on stderr (``files.warn``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .hook import when_cuda_initialized
from .names import ENV_DIR
from .process_log import log_process
from .stderr import line, warn

if TYPE_CHECKING:  # imported once torch.cuda loads: every Python process starts the bootstrap
    from .options import Options
    from .recorder import Recorder
    from .sampler import OnState

_recorder: Recorder | None = None


def active() -> Recorder | None:
    """This process's recorder, once CUDA started it."""
    return _recorder


def install() -> None:
    """Arm the recorder if ``$NSYSFRAG_RECORD_DIR`` names a record folder (the bootstrap)."""
    out_dir = os.environ.get(ENV_DIR, "")
    if not out_dir:
        return
    log_process(out_dir, "python")

    def begin(torch: Any) -> None:
        from .options import Options

        start(torch, Options.from_environment(), out_dir)

    when_cuda_initialized(
        begin,
        on_import=lambda: log_process(out_dir, "torch"),
    )


def start(
    torch: Any,
    options: Options,
    out_dir: str,
    on_state: OnState | None = None,
    sample_in_background: bool = True,
) -> Recorder | None:
    """Record this process (CUDA is initialized); None, with a warning, when it cannot."""
    global _recorder
    from .recorder import Recorder, Unsupported

    if _recorder is not None and _recorder.pid == os.getpid():
        return _recorder
    recorder = Recorder(torch, options, out_dir, on_state)
    # Under nsysfrag record the command says once, at its end, what every process logged here;
    # a program recording itself (nsysfrag.torch.monitor) hears it from its own process.
    alone = not os.environ.get(ENV_DIR)
    try:
        folder = recorder.start(sample_in_background)
    except Unsupported as err:
        log_process(out_dir, "unsupported", error=str(err))
        if alone:
            line(str(err))
        return None
    except Exception as err:  # noqa: BLE001
        message = f"{type(err).__name__}: {err}"
        log_process(out_dir, "error", error=message)
        warn(f"pid {os.getpid()}: the recorder could not start ({message}); the program runs on unrecorded")
        return None
    _recorder = recorder
    log_process(out_dir, "cuda", folder=os.path.basename(folder))
    if recorder.no_history is not None:
        log_process(out_dir, "no_history", error=recorder.no_history)
        if alone:
            warn(recorder.no_history)
    return recorder
