"""The settings ``nsysfrag record --try`` runs a program under: each ``--try KEY:VALUE`` checked
as PyTorch would take it, merged into the program's own PYTORCH_CUDA_ALLOC_CONF (never over a
key the program sets), named as a folder, and matched to the ``whatif`` policy that predicts
it. ``--try auto`` takes them from what ``whatif`` recommends or calls worth trying."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nsysfrag.allocators.torch.config import split_options
from nsysfrag.errors import InputError

AUTO = "auto"
BASELINE = "baseline"
# PyTorch 2.9 reads PYTORCH_ALLOC_CONF before PYTORCH_CUDA_ALLOC_CONF: the one set is merged.
CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
BACKEND_ASYNC = "backend:cudaMallocAsync"
_KEYS = ("expandable_segments", "garbage_collection_threshold", "max_split_size_mb",
         "roundup_power2_divisions", "backend")  # fmt: skip
_SHAPE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*(\S(?:.*\S)?)\s*$")


@dataclass(frozen=True, slots=True)
class TrySetting:
    """One PYTORCH_CUDA_ALLOC_CONF option to try: ``expandable_segments:True``."""

    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}:{self.value}"

    @property
    def folder(self) -> str:
        """The run's folder name: the setting with ``=`` for ``:`` (no ``:`` in a path that
        may end up in a search path), brackets and commas kept out."""
        return re.sub(r"[^A-Za-z0-9_.=-]", "_", f"{self.key}={self.value}")

    def policy(self, program_conf: str) -> str:
        """The ``whatif`` policy that replays the baseline under this setting: the program's
        own options with this one added."""
        if str(self) == BACKEND_ASYNC:
            return "cuda-async"
        items = [*split_options(program_conf), str(self)]
        return "torch:" + ",".join(i.strip().replace(":", "=", 1) for i in items)


def parse_try(text: str) -> TrySetting:
    """``--try KEY:VALUE``; one line saying what to write when it is not a setting PyTorch takes."""
    m = _SHAPE.match(text)
    if m is None:
        raise InputError(
            f"--try {text!r}: write one PYTORCH_CUDA_ALLOC_CONF option as KEY:VALUE, e.g."
            " --try expandable_segments:True (or --try auto)"
        )
    key, value = m.groups()
    if key not in _KEYS:
        raise InputError(
            f"--try {text!r}: {key} is not an allocator setting nsysfrag can try; choose from"
            f" {', '.join(_KEYS)}"
        )
    check_value(key, value, text)
    return TrySetting(key, value)


def check_value(key: str, value: str, text: str) -> None:
    """The value as PyTorch's parser would accept it for ``key``."""
    problem = None
    if key == "expandable_segments" and value not in ("True", "False"):
        problem = "True or False"
    elif key == "backend" and value not in ("native", "cudaMallocAsync"):
        problem = "native or cudaMallocAsync"
    elif key == "garbage_collection_threshold":
        try:
            ok = 0.0 < float(value) < 1.0
        except ValueError:
            ok = False
        problem = None if ok else "a fraction strictly between 0 and 1, e.g. 0.8"
    elif key == "max_split_size_mb" and not (value.isdigit() and int(value) > 20):
        problem = "a whole number of MB above 20 (PyTorch's large-segment size), e.g. 256"
    elif key == "roundup_power2_divisions":
        from nsysfrag.allocators.torch.config import TorchConfig

        try:
            TorchConfig.parse(f"{key}:{value}")
        except InputError:
            problem = "a power of 2 (e.g. 4), or a list such as [256:1,512:2,>:4]"
    if problem:
        raise InputError(f"--try {text!r}: {key} takes {problem}")


def parse_tries(texts: Sequence[str]) -> tuple[list[TrySetting], bool]:
    """Every --try (in order, each once) and whether ``auto`` was among them."""
    settings: list[TrySetting] = []
    auto = False
    for text in texts:
        if text.strip() == AUTO:
            auto = True
            continue
        s = parse_try(text)
        if s in settings:
            raise InputError(f"--try {text!r}: given twice; name each setting once")
        clash = next((t for t in settings if t.key == s.key), None)
        if clash is not None:
            raise InputError(
                f"--try {text!r} and --try {str(clash)!r} set the same key; a round tries one"
                " value per key (run another round for the other)"
            )
        settings.append(s)
    return settings, auto


def program_conf(environ: Mapping[str, str]) -> tuple[str, str]:
    """(the variable the program's allocator reads, its value) from the environment."""
    for name in CONF_VARIABLES:
        if environ.get(name, "").strip():
            return name, environ[name]
    return "PYTORCH_CUDA_ALLOC_CONF", ""


def conf_keys(conf: str) -> dict[str, str]:
    """``{key: value}`` of a PYTORCH_CUDA_ALLOC_CONF string."""
    out = {}
    for item in split_options(conf):
        key, _, value = item.partition(":")
        out[key.strip()] = value.strip()
    return out


def already_set(settings: Iterable[TrySetting], conf: str, where: str) -> None:
    """Refuse a setting whose key the program's own conf sets (``where`` says where it was
    seen): trying it would override the program, not add to it."""
    keys = conf_keys(conf)
    for s in settings:
        if s.key in keys:
            raise InputError(
                f"--try {s}: the program already sets {s.key}:{keys[s.key]} ({where}); drop this"
                f" --try, or remove {s.key} from the program's settings to compare"
            )


def merged(conf: str, setting: TrySetting | None) -> str:
    """The program's conf with ``setting`` added (the baseline: unchanged)."""
    if setting is None:
        return conf
    return ",".join(filter(None, (conf.strip().strip(","), str(setting))))


def settings_from_conf(candidate_conf: str | None, own_conf: str) -> list[TrySetting]:
    """The options of a policy's PYTORCH_CUDA_ALLOC_CONF that the program's own conf lacks:
    what ``--try auto`` adds for a ``whatif`` candidate."""
    if not candidate_conf:
        return []
    own = conf_keys(own_conf)
    out = []
    for key, value in conf_keys(candidate_conf).items():
        if key in _KEYS and own.get(key) != value:
            out.append(TrySetting(key, value))
    return out
