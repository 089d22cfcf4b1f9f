"""The schema name of every JSON document nsysfrag writes, in one place: the writer stamps it
and whatever reads a document back (checks, the history, a job) refuses any other."""

from __future__ import annotations

ANALYSIS = "nsysfrag/1"  # analyze on one input (reporters.json_report)
JOB = "nsysfrag-job/1"  # analyze on several inputs (job.document)
