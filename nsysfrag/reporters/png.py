"""One PNG file per figure and space."""

from __future__ import annotations

from pathlib import Path

from nsysfrag.analysis import Analysis
from nsysfrag.reporters.figures import figures_for


def png_path(folder: Path, pid: int, device: int, name: str) -> Path:
    """``<folder>/pid<pid>_dev<device>_<name>.png``."""
    return folder / f"pid{pid}_dev{device}_{name}.png"


def write_pngs(analysis: Analysis, folder: Path) -> list[Path]:
    """Write every figure of every space into ``folder`` (created if missing); return the paths,
    space by space in ``(pid, device)`` order, figures in ``figure_builders`` order (no time
    plot for a space that is one moment: ``figures_for``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for space in analysis.spaces:
        for name, build in figures_for(space).items():
            path = png_path(folder, space.pid, space.device, name)
            # dpi="figure" so a user's savefig.dpi rcParam cannot change the pixel size.
            build(space).savefig(path, format="png", dpi="figure")
            written.append(path)
    return written
