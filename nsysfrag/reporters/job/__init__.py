"""The job's reports, read from its ``nsysfrag-job/1`` document through ``checks.job_ranks``:
``terminal`` (the rank table, the worst rank and why, the skew, and a job compared with a job),
``html`` (one self-contained page) and ``heatmap`` (its rank × time SVG)."""

from __future__ import annotations
