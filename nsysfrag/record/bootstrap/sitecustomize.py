"""nsysfrag record's bootstrap: every Python process of the recorded command imports this
module at start-up (it is first on ``PYTHONPATH``). It arms the recorder, which waits for
torch to initialize CUDA, then runs the ``sitecustomize`` it shadows, if there is one.

Nothing here may stop the program: an error of the recorder is one warning line. An error of
the shadowed ``sitecustomize`` is its own, reported as Python reports it without us.
"""

import os
import sys


def _arm_recorder() -> None:
    if not os.environ.get("NSYSFRAG_RECORD_DIR"):
        return
    try:
        # This folder is on sys.path in a recorded process; mypy does not know it.
        import nsysfrag_recorder  # type: ignore[import-not-found]

        nsysfrag_recorder.install()
    except Exception as err:  # noqa: BLE001
        try:
            sys.stderr.write(
                f"nsysfrag record: warning: the recorder was not armed ({type(err).__name__}:"
                f" {err}); the program runs on unrecorded\n"
            )
        except Exception:  # noqa: BLE001, S110  (no stderr left to warn on)
            pass


def _run_shadowed() -> None:
    """The next ``sitecustomize`` on ``sys.path`` after this folder, run as Python would
    have run it."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_arm_recorder()
_run_shadowed()
