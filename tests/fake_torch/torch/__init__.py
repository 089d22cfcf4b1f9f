"""A fake ``torch`` for tests without a GPU (tests/fake_torch/README.md).

Tensors are bytes on a fake CUDA device: ``torch.empty(4096, dtype=torch.uint8,
device="cuda")`` asks the device's caching allocator (the sample generator's model of
PyTorch's) for 4096 bytes, and the tensor's last reference going away frees them.
"""

from __future__ import annotations

import math
import os
from typing import Any

# FAKE_TORCH_VERSION picks the Python API of that torch where it differs (torch/cuda/memory.py).
__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0") + "+fake"


class dtype:
    def __init__(self, name: str, itemsize: int) -> None:
        self.name = name
        self.itemsize = itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


uint8 = dtype("uint8", 1)
float16 = half = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
float32 = float = dtype("float32", 4)
int64 = long = dtype("int64", 8)


class device:
    def __init__(self, spec: Any, index: int | None = None) -> None:
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        text = str(spec)
        kind, _, number = text.partition(":")
        self.type = kind
        self.index = int(number) if number else index

    def __repr__(self) -> str:
        return f"device(type={self.type!r}, index={self.index})"


from torch import (
    _C,
    _devices,
    cuda,
    version,
)


class Tensor:
    """Bytes on a fake device; freed when the last reference goes."""

    def __init__(self, shape: tuple[int, ...], kind: dtype, where: device) -> None:
        self.shape = shape
        self.dtype = kind
        self.device = where
        self.nbytes = math.prod(shape) * kind.itemsize
        self._block = None
        self._on = None
        if where.type == "cuda":
            cuda._lazy_init()
            index = cuda.current_device() if where.index is None else where.index
            self._on = _devices.device(index)
            self._block = self._on.malloc(self.nbytes)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def __del__(self) -> None:
        if self._block is not None and self._on is not None:
            try:
                self._on.free(self._block)
            except Exception:  # noqa: BLE001, S110  (interpreter teardown)
                pass
            self._block = None


def empty(*size: Any, dtype: dtype = float32, device: Any = "cpu") -> Tensor:
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    return Tensor(tuple(int(n) for n in shape), dtype, globals()["device"](device))


zeros = empty

__all__ = ["_C", "Tensor", "cuda", "device", "empty", "version"]
