"""A whole distributed job: one input per rank, each analyzed as it would be alone, one report.

``inputs`` turns the command line's files, folders and patterns into ranks; ``worker`` analyzes
one rank (in a pool process, a Dask worker or in-process); ``pool`` and ``cluster`` run the
ranks in parallel; ``document`` builds the ``nsysfrag-job/1`` JSON (the worst rank, the skew);
``command`` ties them together for ``analyze``. The job's document is read back by
``checks.job_ranks`` (the rank summaries) and ``checks.job_comparison`` (two jobs rank by rank),
and rendered by ``reporters.job`` (terminal, HTML, heatmap).
"""

from __future__ import annotations
