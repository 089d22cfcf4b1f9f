"""A whole distributed job: one input per rank, each analyzed as it would be alone, one report.

``inputs`` turns the command line's files, folders and patterns into ranks; ``worker`` analyzes
one rank (in a pool process, a Dask worker or in-process); ``pool`` and ``cluster`` run the
ranks in parallel; ``document`` builds the ``nsysfrag-job/1`` JSON and what the reports show
(the rank summaries, the worst rank, the skew); ``comparison`` pairs two jobs rank by rank;
``terminal``, ``html`` and ``heatmap`` render; ``command`` ties them together for ``analyze``.
"""

from __future__ import annotations
