"""The trend chart of a long history draws its lines without a marker per run."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from nsysfrag.history.chart import MAX_MARKED_RUNS, trend_figure
from nsysfrag.history.store import StoredRun, StoredSpace
from nsysfrag.history.trends import series

METRIC = "max.global_frag"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def runs(n: int) -> list[StoredRun]:
    return [
        StoredRun(
            id=i + 1, recorded_at=T0 + timedelta(hours=i), trace_path="t.sqlite", trace_sha256="0",
            model="observed", granularity_bytes=1, capacity_override_bytes=None, nsys_version=None,
            host=None, label=None, nsysfrag_version=None,
            spaces=(StoredSpace({"pid": 7, "device": 0, METRIC: (i % 10) / 20}),),
        )
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "marker"), [(3, "o"), (MAX_MARKED_RUNS, "o"), (MAX_MARKED_RUNS + 1, "none")]
)
def test_markers_only_while_each_run_can_be_seen(n: int, marker: str) -> None:
    history = runs(n)
    all_series = series(history, METRIC)
    fig = trend_figure(history, all_series, METRIC)
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == all_series[0].key]
    assert line.get_marker() == marker
    assert len(line.get_xdata()) == n  # every run is still on the line
