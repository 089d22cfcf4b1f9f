"""The inputs nsysfrag reads: nsys exports and PyTorch memory snapshots."""
