"""JSON text for what localspec prints (``--json``): strict JSON, never ``NaN`` or ``Infinity``.

Python's :func:`json.dumps` writes non-finite floats as ``NaN`` / ``Infinity``, which strict JSON
parsers (``jq``, JavaScript's ``JSON.parse``, Go) refuse. A figure that is not finite (a rate over
no time, a cost read from a damaged cache) is printed as ``null``.
"""

from __future__ import annotations

import json
import math
import numbers


def finite(value):
    """``value`` with every float that is not finite, at any depth of dicts, lists and tuples,
    replaced by None."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):   # numpy's floats too
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    """:func:`json.dumps` of :func:`finite` ``(value)``, with ``allow_nan=False``."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
