"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``)."""
