"""Nsight Systems traces: the SQLite export reader, NVTX sites and the nsys runner."""
