"""One input through the pipeline as a command asks for it: what to compute and where to put
it (`request`), the input read, analyzed and reported (`single`), the outputs checked and
written (`outputs`) and what goes to stderr meanwhile (`feedback`). ``analyze`` runs it for one
input and, through ``job``, for every rank of a job; nothing here knows of click."""

from __future__ import annotations
