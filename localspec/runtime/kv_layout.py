"""The target's KV layout with several slots: one stream per slot, or one pool of every slot's cells.

llama.contexts.target_context builds either; this module chooses (docs/server.md, "The KV layout
of several slots", has the measurements behind ``auto``).
"""

from __future__ import annotations

from ..core import options
from ..core.errors import LocalspecError


def choose(requested: str, slots: int, *, shared_kv: bool = False, recurrent: bool = False) -> str:
    """The target KV layout of an engine of ``slots`` slots: ``streams`` (one KV stream per slot,
    llama-server's layout: a row's attention spans its own slot's cells) or ``unified`` (one pool
    of cells: every row's attention spans every slot's, masked). ``auto``: streams wherever
    several slots decode together, except where the pool is what the engine relies on: a drafter
    that reads the target's own cells (Gemma 4's assistant), a recurrent target. Exact batches
    (``rows_match``) take streams too: in the pool a slot's later rows can land in holes another
    slot's rejected drafts left below its earlier cells, and the one-row attention then sums its
    cells in another order (4 slots of EAGLE chains left plain decoding's text at tokens 58 and 86;
    docs/speculation.md, "Exact mode"). docs/server.md gives the measurements behind ``auto``."""
    if requested not in options.KV_LAYOUTS:
        raise LocalspecError(f"unknown KV layout '{requested}' ({', '.join(options.KV_LAYOUTS)})")
    if slots <= 1 or recurrent:
        return "unified"
    if requested == "streams" and shared_kv:
        raise LocalspecError("a drafter that shares the target's KV cells (Gemma 4's assistant) needs "
                             "--kv-layout unified")
    if requested != "auto":
        return requested
    return "unified" if shared_kv else "streams"
