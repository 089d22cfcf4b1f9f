"""Generate large, realistic PyTorch memory snapshots for the scale benchmark (issue 13).

A training loop (8 transformer layers, Adam, ``zero_grad(set_to_none=True)``, the loader's
tensors freed on a side stream) is served by the caching-allocator re-implementation of
``sample_traces/make_snapshots.py`` until its allocator state repeats from one cycle of steps
to the next; that cycle of trace entries is then laid end to end (times shifted) for as many
entries as asked, and the final state of the cycle is the snapshot's ``segments``. So the trace
replays exactly onto the final segments, whatever its length.

Stacks are as deep as ``_record_memory_history(stacks="all")`` makes them: 20 to 40 frames,
C++ frames first, Python frames interleaved with the interpreter's own. As torch writes them,
every entry has its *own* frames list, while the frame dicts are shared (``py_symbolize`` makes
one dict per distinct frame); the pickle is streamed opcode by opcode, so a 5 M-entry file never
exists as Python objects in this process. Files are cached under ``benchmarks/.data/``.

    python benchmarks/big_snapshot.py 200000      # writes and prints the path
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import random
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
MiB = 1 << 20
GiB = 1 << 30


def load_make_snapshots() -> Any:
    """``sample_traces/make_snapshots.py`` as a module (it is a script, not a package)."""
    name = "nsysfrag_make_snapshots"
    if name in sys.modules:
        return sys.modules[name]
    path = HERE.parent / "sample_traces" / "make_snapshots.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- deep stacks


class DeepStacks:
    """One frames list per call site (20–40 frames), built from shared frame dicts."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.frames: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.sites: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self.aten = [
            self._frame(f"at::native::op_{k}(at::Tensor const&)", "??", 0) for k in range(600)
        ]
        self.alloc = [
            self._frame("torch::unwind::unwind()", "??", 0),
            self._frame("torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0),
            self._frame("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp", 0),
            self._frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char,"
                        " unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp", 0),
            self._frame("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed"
                        " char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp", 0),
            self._frame("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)", "??", 0),
            self._frame("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??", 0),
        ]  # fmt: skip
        self.eval = self._frame(
            "_PyEval_EvalFrameDefault", "/usr/local/src/conda/python-3.11.9/Python/ceval.c", 5140
        )
        self.tail = [
            self._frame(
                "PyEval_EvalCode", "/usr/local/src/conda/python-3.11.9/Python/ceval.c", 1148
            ),
            self._frame("Py_RunMain", "/usr/local/src/conda/python-3.11.9/Modules/main.c", 694),
            self._frame("__libc_start_main", "??", 0),
            self._frame("_start", "??", 0),
        ]

    def _frame(self, name: str, filename: str, line: int) -> dict[str, Any]:
        key = (name, filename, line)
        if key not in self.frames:
            self.frames[key] = {"name": name, "filename": filename, "line": line}
        return self.frames[key]

    def py(self, *calls: tuple[str, int, str], torch_depth: int = 2) -> list[dict[str, Any]]:
        """C++ allocation frames, aten frames, then torch's and the user's Python frames
        (``calls``, innermost first), each under an interpreter frame, then the process's."""
        key = ("py", calls, torch_depth)
        if key not in self.sites:
            rng = self.rng
            frames = list(self.alloc) + rng.sample(self.aten, rng.randint(8, 18))
            torch = [
                (
                    f"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/mod{k}.py",
                    100 + k,
                    "forward",
                )
                for k in range(torch_depth)
            ]
            for filename, line, name in [
                *torch,
                *((f"/workspace/gpt/{f}", ln, n) for f, ln, n in calls),
            ]:
                frames.append(self._frame(name, filename, line))
                frames.append(self.eval)
            frames.extend(self.tail)
            while len(frames) < 20:
                frames.insert(len(self.alloc), rng.choice(self.aten))
            self.sites[key] = frames[:40]
        return self.sites[key]

    def autograd(self, node: str) -> list[dict[str, Any]]:
        key = ("autograd", node)
        if key not in self.sites:
            rng = self.rng
            frames = list(self.alloc) + rng.sample(self.aten, rng.randint(12, 24))
            frames += [
                self._frame(f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor>&&)", "Functions.cpp", 0),
                self._frame("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", "??", 0),
                self._frame("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
                self._frame("execute_native_thread_routine", "??", 0),
                self._frame("start_thread", "??", 0),
                self._frame("__clone", "??", 0),
            ]  # fmt: skip
            self.sites[key] = frames
        return self.sites[key]


# ---------------------------------------------------------------- the periodic workload


def _training_cycle(seed: int = 13) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(one cycle of trace entries, the segments at its end (= at its start), its duration in
    µs): steps are run in cycles of three sequence lengths until the allocator's state at the
    start of a cycle repeats."""
    ms = load_make_snapshots()
    a = ms.CachingAllocator(85_899_345_920, 600 * MiB, expandable=False, va_base=0x7F2A_0000_0000)
    st = DeepStacks(seed)
    layers, h, vocab, batch = 8, 1024, 32000, 4
    params = [vocab * h * 2] + [n for _ in range(layers)
                                for n in (h * 2, 3 * h * h * 2, 3 * h * 2, h * h * 2, h * 2, 4 * h * h * 2, 4 * h * 2, 4 * h * h * 2)]  # fmt: skip
    for n in params:
        a.malloc(n, st.py(("model.py", 211, "__init__"), ("train.py", 40, "main")))
    adam = [a.malloc(2 * n, st.py(("train.py", 71, "train_step"), torch_depth=3)) for n in params]
    a.tick(2e6)

    def step(seq: int) -> None:
        act = batch * seq * h * 2
        tokens = a.malloc(
            batch * seq * 8, st.py(("train.py", 58, "train_step"), ("train.py", 97, "main"))
        )
        x = a.malloc(act, st.py(("model.py", 190, "forward"), ("train.py", 61, "train_step")))
        a.free(tokens, side_stream=True)
        saved = []
        for i in range(layers):
            at = lambda line, n: a.malloc(n, st.py(("model.py", line, "forward"), ("model.py", 196, "forward"),
                                                   ("train.py", 61, "train_step")))  # fmt: skip
            ln1, qkv, attn, proj = at(88, act), at(92, 3 * act), at(97, act), at(101, act)
            x2 = at(102, act)
            fc1, gelu, fc2, x3 = at(121, 4 * act), at(122, 4 * act), at(123, act), at(124, act)
            saved.append([x, ln1, qkv, attn, proj, fc1, gelu, fc2])
            a.free(x2)
            x = x3
            a.tick(900 + 100 * i)
        logits = a.malloc(
            batch * seq * vocab * 2,
            st.py(("model.py", 201, "forward"), ("train.py", 61, "train_step")),
        )
        g_logits = a.malloc(batch * seq * vocab * 2, st.autograd("LogSoftmaxBackward0"))
        a.free(logits)
        g_x = a.malloc(act, st.autograd("MmBackward0"))
        a.free(g_logits)
        a.free(x)
        grads = []
        for i in reversed(range(layers)):
            x_in, ln1, qkv, attn, proj, fc1, gelu, fc2 = saved[i]
            g_h = a.malloc(4 * act, st.autograd("MmBackward0"))
            grads.append(a.malloc(params[1 + 8 * i + 7], st.autograd("MmBackward0")))
            a.free(fc2)
            g_gelu = a.malloc(4 * act, st.autograd("GeluBackward0"))
            a.free(g_h)
            a.free(gelu)
            grads.append(a.malloc(params[1 + 8 * i + 5], st.autograd("MmBackward0")))
            a.free(g_gelu)
            a.free(fc1)
            g_attn = a.malloc(act, st.autograd("MmBackward0"))
            a.free(proj)
            g_qkv = a.malloc(3 * act, st.autograd("ScaledDotProductFlashAttentionBackward0"))
            a.free(g_attn)
            a.free(attn)
            grads.append(a.malloc(params[1 + 8 * i + 1], st.autograd("MmBackward0")))
            g_in = a.malloc(act, st.autograd("MmBackward0"))
            a.free(g_qkv)
            a.free(qkv)
            a.free(ln1)
            a.free(x_in)
            a.free(g_x)
            g_x = g_in
            a.tick(1800)
        a.free(g_x)
        for n in params:  # optimizer.step(): foreach temporaries
            tmp = a.malloc(2 * n, st.py(("train.py", 71, "train_step"), torch_depth=3))
            a.free(tmp)
        for g in grads:  # zero_grad(set_to_none=True)
            a.free(g)
        a.tick(30_000)

    def state() -> tuple[Any, ...]:
        blocks = tuple(
            sorted(
                (b.address, b.size, b.allocated, b.pending, b.requested) for b in a.blocks.values()
            )
        )
        return blocks, tuple(sorted(a.segments.items())), tuple(b.address for b in a.pending)

    seen: list[tuple[tuple[Any, ...], int, int]] = []
    for _ in range(20):
        seen.append((state(), len(a.trace), a.now_us))
        for seq in (1024, 2048, 1536):
            step(seq)
        if state() == seen[-1][0]:
            _, start, t_start = seen[-1]
            del adam
            return a.trace[start:], a.snapshot("")["segments"], a.now_us - t_start
    raise RuntimeError("the workload did not reach a steady cycle")


def entries(cycle: list[dict[str, Any]], period_us: int, n: int) -> Iterator[dict[str, Any]]:
    """The last ``n`` entries of the cycle repeated: the window ends at a cycle's end."""
    p = len(cycle)
    first = (-n) % p  # where in the cycle the window starts
    repeats = (n + first) // p
    k = first
    for r in range(repeats):
        shift = (r - repeats + 1) * period_us
        for e in cycle[k:]:
            yield {**e, "time_us": e["time_us"] + shift}
        k = 0


# ---------------------------------------------------------------- a streaming pickle writer


class _Writer:
    """Writes protocol-4 opcodes the way ``pickle`` does (memoizing every container and
    string), without ever holding the whole object graph."""

    def __init__(self, out: io.BufferedWriter) -> None:
        self.out = out
        self.memo: dict[Any, int] = {}  # id(obj) for containers, ("s", text) for strings

    def _get(self, index: int) -> None:
        self.out.write(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))

    def _memoize(self, key: Any) -> None:
        self.memo[key] = len(self.memo)
        self.out.write(b"\x94")

    def obj(self, o: Any, own: bool = False) -> None:
        """Write ``o``; ``own`` forces a fresh container even if an equal one was written
        (an entry's own frames list)."""
        w = self.out.write
        if o is None:
            w(b"N")
        elif o is True:
            w(b"\x88")
        elif o is False:
            w(b"\x89")
        elif isinstance(o, int):
            if 0 <= o < 256:
                w(b"K" + bytes([o]))
            elif 0 <= o < 65536:
                w(b"M" + struct.pack("<H", o))
            elif -(1 << 31) <= o < (1 << 31):
                w(b"J" + struct.pack("<i", o))
            else:
                data = pickle.encode_long(o)
                w(b"\x8a" + bytes([len(data)]) + data)
        elif isinstance(o, float):
            w(b"G" + struct.pack(">d", o))
        elif isinstance(o, str):
            key = ("s", o)
            if key in self.memo:
                return self._get(self.memo[key])
            data = o.encode("utf-8")
            w(
                (
                    b"\x8c" + bytes([len(data)])
                    if len(data) < 256
                    else b"X" + struct.pack("<I", len(data))
                )
                + data
            )
            self._memoize(key)
        elif isinstance(o, tuple):
            if not o:
                w(b")")
                return
            for item in o:
                self.obj(item)
            w({1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(o), b""))
            assert len(o) <= 3
            self._memoize(("t", id(o), len(self.memo)))
        elif isinstance(o, (list, dict)):
            if not own and id(o) in self.memo:
                return self._get(self.memo[id(o)])
            if isinstance(o, list):
                w(b"]")
                self._memoize(id(o) if not own else ("own", len(self.memo)))
                self.items(o, own=False)
            else:
                w(b"}")
                self._memoize(id(o) if not own else ("own", len(self.memo)))
                items = list(o.items())
                for k in range(0, len(items), 1000):
                    w(b"(")
                    for key, value in items[k : k + 1000]:
                        self.obj(key)
                        self.obj(value, own=key == "frames")
                    w(b"u")
        else:
            raise TypeError(type(o))

    def items(self, items: Any, own: bool) -> None:
        """APPENDS in batches of 1000, as pickle writes a list's items; ``own``: every item
        is a fresh object (a temporary whose id may be reused later)."""
        batch: list[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == 1000:
                self._appends(batch, own)
                batch = []
        if batch:
            self._appends(batch, own)

    def _appends(self, batch: list[Any], own: bool) -> None:
        if len(batch) == 1:
            self.obj(batch[0], own)
            self.out.write(b"a")
            return
        self.out.write(b"(")
        for item in batch:
            self.obj(item, own)
        self.out.write(b"e")


def write_snapshot(path: Path, n_entries: int) -> None:
    """Stream a snapshot of ``n_entries`` trace entries to ``path``."""
    cycle, segments, period = _training_cycle()
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        w = _Writer(f)
        f.write(b"\x80\x04}")
        w._memoize("top")
        f.write(b"(")
        w.obj("segments")
        w.obj(segments)
        w.obj("device_traces")
        f.write(b"]")
        w._memoize("traces")
        f.write(b"]")
        w._memoize("trace0")
        w.items(entries(cycle, period, n_entries), own=True)
        f.write(b"a")  # the device's trace into device_traces
        w.obj("allocator_settings")
        w.obj({"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
               "expandable_segments": False, "roundup_power2_divisions": {str(1 << k): 0 for k in range(16)}})  # fmt: skip
        w.obj("external_annotations")
        w.obj([])
        f.write(b"u.")
    tmp.replace(path)


def big_snapshot(n_entries: int) -> Path:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"snapshot_{n_entries}.pickle"
    if not path.exists():
        write_snapshot(path, n_entries)
    return path


def _self_check() -> None:
    """The streamed pickle holds exactly the objects it was built from."""
    cycle, segments, period = _training_cycle()
    expected = list(entries(cycle, period, 2500))
    path = DATA / "selfcheck.pickle"
    DATA.mkdir(exist_ok=True)
    write_snapshot(path, 2500)
    data = pickle.loads(path.read_bytes())
    assert data["segments"] == segments
    assert data["device_traces"] == [expected]
    frames = [e["frames"] for e in data["device_traces"][0]]
    assert len({id(f) for f in frames}) == len(frames), "every entry has its own frames list"
    assert len({id(d) for f in frames for d in f}) < 2000, "frame dicts are shared"
    path.unlink()


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        _self_check()
        print("ok")
    else:
        for arg in sys.argv[1:]:
            print(big_snapshot(int(arg)))
