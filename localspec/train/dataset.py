"""Token-id training data on disk: one JSON line per (prompt, response) sequence.

``sequences.jsonl`` grows one line per finished sequence (flushed at once, so an interrupted run
keeps everything it finished and ``--resume`` skips those prompts); ``.jsonl.gz`` is the same,
compressed, for committing. Features are never stored: they are recomputed from the token ids
by prefill through the target (:mod:`.features`), so the same ids reproduce the same training.
Records are deduplicated by prompt key and by the hash of their token ids.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..core.atomic import atomic_path, atomic_write
from ..core.errors import LocalspecError
from ..core.units import format_size

# Refuse to start writing when less than this is free where data, checkpoints or the drafter go.
MIN_FREE_BYTES = 64 * 1024 * 1024


def check_free_space(path: Path, need: int = MIN_FREE_BYTES) -> None:
    """One-line error unless ``need`` bytes are free on the filesystem holding ``path``."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise LocalspecError(f"not enough disk space in {path}: {format_size(free)} free, "
                             f"need at least {format_size(need)}")


@dataclass
class Sequence:
    key: str               # identifies the prompt (hash of its rendered token ids)
    category: str
    prompt: list[int]
    response: list[int]
    finish: str = "stop"
    group: str = ""        # prompts of one topic share a group; held-out splits go by group

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response

    def digest(self) -> str:
        return hashlib.sha1(json.dumps([self.prompt, self.response]).encode()).hexdigest()

    def to_json(self) -> str:
        obj = {"key": self.key, "category": self.category, "prompt": self.prompt, "response": self.response,
               "finish": self.finish}
        if self.group:
            obj["group"] = self.group
        return json.dumps(obj, separators=(",", ":"))


def prompt_key(tokens: list[int]) -> str:
    return hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:16]


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _token(t) -> int:
    """A token id from a dataset line: a non-negative integer (JSON true/1.5/"7" are not)."""
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31:
        raise ValueError(t)
    return t


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_sequences(path: Path) -> list[Sequence]:
    """Read a dataset file (.jsonl or .jsonl.gz), deduplicated; a torn last line (interrupted write) is skipped."""
    path = Path(path)
    if not path.is_file():
        raise LocalspecError(f"{path}: no such dataset file")
    out: list[Sequence] = []
    keys: set[str] = set()
    digests: set[str] = set()
    try:
        with _open_text(path) as fh:
            lines = fh.read().splitlines()
    except UnicodeDecodeError:
        raise LocalspecError(f"{path}: not a dataset (expected UTF-8 JSON lines{', gzipped' if path.suffix == '.gz' else ''})") from None
    except (OSError, EOFError) as exc:   # unreadable, or not (or a truncated) gzip file
        raise LocalspecError(f"{path}: cannot read the dataset ({_one_line(exc)})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            seq = Sequence(str(obj["key"]), str(obj.get("category", "")), [_token(t) for t in obj["prompt"]],
                           [_token(t) for t in obj["response"]], str(obj.get("finish", "stop")),
                           str(obj.get("group", "")))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            if lineno == len(lines):
                continue
            raise LocalspecError(f"{path}:{lineno}: not a dataset record") from None
        d = seq.digest()
        if seq.key in keys or d in digests:
            continue
        keys.add(seq.key)
        digests.add(d)
        out.append(seq)
    return out


class DatasetWriter:
    """Appends sequences to ``path`` one line at a time; knows which prompt keys are done."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_free_space(self.path.parent)
        self.sequences: list[Sequence] = []
        if self.path.exists():
            if not resume:
                raise LocalspecError(f"{self.path} exists: pass --resume to continue it, or choose another output")
            self.sequences = load_sequences(self.path)
            # rewrite without a torn tail so appends start on a clean line
            atomic_write(self.path, "".join(s.to_json() + "\n" for s in self.sequences))
        self.keys = {s.key for s in self.sequences}
        self._digests = {s.digest() for s in self.sequences}
        self._fh = open(self.path, "a", encoding="utf-8")

    def add(self, seq: Sequence) -> bool:
        d = seq.digest()
        if seq.key in self.keys or d in self._digests:
            return False
        self._fh.write(seq.to_json() + "\n")
        self._fh.flush()
        self.keys.add(seq.key)
        self._digests.add(d)
        self.sequences.append(seq)
        return True

    def close(self) -> None:
        self._fh.close()


def write_compressed(sequences: list[Sequence], path: Path) -> Path:
    """The dataset as .jsonl.gz (deterministic bytes: no timestamp), written atomically."""
    path = Path(path)
    check_free_space(path.parent)
    data = "".join(s.to_json() + "\n" for s in sequences).encode("utf-8")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
            gz.write(data)
    return path
