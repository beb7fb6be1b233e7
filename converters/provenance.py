"""What a converted drafter records about where it came from: a Hub repo id and revision, or the
base name of the local directory or file, never a path of the machine that converted it (a GGUF
is shared; its metadata must not carry the converter's home directory).
"""

from __future__ import annotations

import re
from pathlib import PurePath

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HF_CACHE_REPO = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def hub_snapshot(path: PurePath) -> tuple[str, str] | None:
    """(repo id, commit) when ``path`` lies in a Hugging Face cache snapshot
    (``.../models--ORG--NAME/snapshots/COMMIT[/...]``), else None."""
    parts = path.parts
    for i in range(len(parts) - 2):
        m = _HF_CACHE_REPO.match(parts[i])
        if m and parts[i + 1] == "snapshots" and _COMMIT.match(parts[i + 2]):
            return f"{m['org']}/{m['name']}", parts[i + 2]
    return None


def provenance(source: str, resolved: PurePath | None = None, *, repo_id: bool = False) -> tuple[str, str]:
    """(source, revision) to record for a checkpoint the user named ``source``.

    ``resolved`` is where it was read from (a Hub download's snapshot directory, or the local
    path); ``repo_id`` says the user gave a Hub repo id."""
    if resolved is not None:
        snap = hub_snapshot(PurePath(resolved))
        if snap is not None:
            return snap
    if repo_id:
        return source, ""
    if resolved is not None and PurePath(resolved).name:
        return PurePath(resolved).name, ""
    return base_name(source), ""


def base_name(text: str) -> str:
    """The last component of a path (a name that is not a path is returned as it is)."""
    name = PurePath(text.rstrip("/\\")).name if text else ""
    return name or text.strip("/\\")


def looks_like_path(text: str) -> bool:
    """True for strings that carry a directory: absolute, home-relative or with separators."""
    return text.startswith(("/", "~", "\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", text)) or \
        ("/" in text and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[0-9a-f]{7,40})?$", text))
