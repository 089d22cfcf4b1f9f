"""The ``observed`` model: blocks where the trace says they were."""
