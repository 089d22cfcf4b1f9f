"""One PNG file per figure and space."""

from __future__ import annotations

from pathlib import Path

from nsysfrag import destinations
from nsysfrag.analysis import Analysis
from nsysfrag.reporters import shared_figures
from nsysfrag.reporters.figure_axes import save_figure
from nsysfrag.reporters.figures import figures_for


def png_path(folder: Path, pid: int, device: int, name: str) -> Path:
    """``<folder>/pid<pid>_dev<device>_<name>.png``."""
    return folder / f"pid{pid}_dev{device}_{name}.png"


def write_pngs(analysis: Analysis, folder: Path, option: str = "--png") -> list[Path]:
    """Write every figure of every space into ``folder`` (created if missing); return the paths,
    space by space in ``(pid, device)`` order, figures in ``figure_builders`` order (no time
    plot for a space that is one moment: ``figures_for``). Each file
    is checked and renamed into place only once every figure is drawn (``destinations``)."""
    written = []
    with destinations.folder_batch(folder, option) as (folder, batch):
        for space in analysis.spaces:
            for name, build in figures_for(space).items():
                path = png_path(folder, space.pid, space.device, name)
                with batch.open(path, binary=True) as f:
                    # dpi="figure" so a user's savefig.dpi rcParam cannot change the pixel size.
                    figure = shared_figures.figure(space, name, build)
                    save_figure(figure, f, format="png", dpi="figure")
                written.append(path)
    return written
