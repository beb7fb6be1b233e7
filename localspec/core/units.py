"""Byte sizes in text, both ways: ``parse_size`` reads what a user types (``12G``, ``800M``),
``format_size`` writes what localspec shows (``1.5 GiB``). Units are binary (1 K = 1024 bytes)."""

from __future__ import annotations

import re

from .errors import LocalspecError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'12G', '12GiB', '8000M', '1.5g', '1048576' -> bytes (K/M/G/T are binary: 1G = 2^30)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise LocalspecError(f"bad size '{text}': use a number with K, M, G or T (e.g. 12G, 8000M)")
    value, unit = float(m.group(1)), (m.group(2) or "b").lower()
    scale = {"b": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}[unit[0]]
    if not value * scale < 1 << 62:   # (inf and nan too) no machine has this much memory
        raise LocalspecError(f"bad size '{text}': too large")
    return int(value * scale)


def format_size(n_bytes: int | float | None) -> str:
    """Bytes for people: '512 B', '2.0 KiB', '3.0 GiB', '-1.5 MiB' (a deficit); None: '—'.
    ``parse_size`` reads every result back to within its rounding (0.05 of the unit)."""
    if n_bytes is None:
        return "—"
    value = float(n_bytes)
    sign, value = ("-" if value < 0 else ""), abs(value)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
