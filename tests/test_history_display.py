"""A long history on screen: the trend chart without a marker per run, the runs table capped
with the rest counted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from nsysfrag.commands import history as history_command
from nsysfrag.history import RunQuery, open_store
from nsysfrag.history.chart import MAX_MARKED_RUNS, trend_figure
from nsysfrag.history.store import StoredRun, StoredSpace
from nsysfrag.history.trends import series
from tests.test_history import T0 as HISTORY_T0
from tests.test_history import invoke, record_series

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


def test_the_table_shows_at_most_its_cap_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "h.sqlite")
    ids = record_series(db, tmp_path, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    with open_store(db) as store:
        assert store.count() == 6 and store.count(RunQuery(limit=4)) == 4
    monkeypatch.setattr(history_command, "TABLE_MAX_RUNS", 3)

    def table(*args: str) -> str:
        result = invoke("history", "--db", db, *args)
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    shown = table("--limit", "100")
    assert "3 run(s)" in shown  # the newest three, as the table's title says
    assert all(f" {i} " in shown for i in ids[-3:]) and "0.2" not in shown
    assert "… and 3 older matching run(s) not shown: the table shows the newest 3" in shown
    assert "--json FILE" in shown
    # The count is of what --limit asked for, and nothing is said when nothing is left out.
    assert "… and 1 older matching run(s) not shown" in table("--limit", "4")
    assert "not shown" not in table("--limit", "3")
    assert "… and 3 older matching run(s) not shown" in table()  # the default 20 is capped too
    since = (HISTORY_T0 + timedelta(days=4)).strftime("%Y-%m-%d")
    assert "not shown" not in table("--limit", "100", "--since", since)  # 2 match: all shown
