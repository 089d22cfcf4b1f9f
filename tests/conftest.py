from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import settings

from nsysfrag.testing.nsys_export import (
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
REAL_TRACES = REPO.parent / "shared" / "real_traces"
REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
# Every snapshot a test can read: the samples, then the genuine ones where they are beside us.
SNAPSHOT_INPUTS = sorted(SAMPLES.glob("*.pickle")) + (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)

# Fuzz tests (tests/hostile) run FUZZ_CI_EXAMPLES examples in CI; `pytest --hypothesis-profile
# fuzz` runs thousands (NSYSFRAG_FUZZ_EXAMPLES sets how many, with or without the profile).
FUZZ_PROFILE = "fuzz"
FUZZ_CI_EXAMPLES = 15
settings.register_profile(
    FUZZ_PROFILE, max_examples=int(os.environ.get("NSYSFRAG_FUZZ_EXAMPLES", "3000")), deadline=None
)


def fuzz_examples() -> int:
    """How many examples a fuzz test runs: the environment, else the profile, else CI's few."""
    if "NSYSFRAG_FUZZ_EXAMPLES" in os.environ:
        return int(os.environ["NSYSFRAG_FUZZ_EXAMPLES"])
    current = getattr(settings, "get_current_profile_name", lambda: "default")()
    return settings.get_profile(FUZZ_PROFILE).max_examples if current == FUZZ_PROFILE else FUZZ_CI_EXAMPLES


MiB = 1 << 20
BASE = 0x7F00_0000_0000


MakeTrace = Callable[..., Path]


@pytest.fixture
def make_trace(tmp_path: Path) -> MakeTrace:
    """Build an nsys-shaped SQLite export from rows; returns its path."""
    counter = iter(range(10_000))

    def build(
        memory: Sequence[MemoryRow],
        api: Sequence[ApiRow] = (),
        nvtx: Sequence[NvtxRow] = (),
        gpus: Sequence[Gpu] = (Gpu(0, total_memory=64 * MiB),),
        options: ExportOptions | None = None,
    ) -> Path:
        return write_export(tmp_path / f"trace{next(counter)}.sqlite", memory, api, nvtx, gpus, options)

    return build


# Every test (and each nsysfrag it starts) runs the compiled kernels, as large inputs do, unless
# the environment says otherwise; the modules that import tests.kernel_modes run both ways.
os.environ.setdefault("NSYSFRAG_KERNELS", "compiled")
# No test leaves a compiler running behind it (nsysfrag.background_compile): the tests of it
# turn it back on in a subprocess of their own.
os.environ.setdefault("NSYSFRAG_BACKGROUND_COMPILE", "off")


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels(request: pytest.FixtureRequest) -> None:
    """Compile the kernels once, before any test, as a user's second run finds them.

    The first run after installing compiles them and says so on stderr (tests/test_install.py
    and tests/test_kernel_cache.py check that, with a cache of their own); every other test
    expects the quiet warm run, whichever test happens to run first.
    """
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs.nsys import read_export

    analyze(read_export(SAMPLES / "training_loop.sqlite"))
    if any("whatif" in item.nodeid for item in request.session.items):
        from nsysfrag.whatif import whatif

        whatif(SAMPLES / "training_snapshot.pickle", validate=True)
        whatif(SAMPLES / "inference_serving.sqlite")
