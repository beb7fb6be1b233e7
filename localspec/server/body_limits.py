"""What a request body may cost before any model work, counted once, as soon as its JSON is
parsed (the OpenAI and the Ollama routes alike): at most :data:`MAX_ITEMS` items in any one list
(messages, input items, tools, content parts, stop strings). A longer list is one 400 naming it,
before the body is validated, converted or rendered with a chat template.

The other bounds come later and as cheaply: the body's bytes (``--max-body``), and the prompt's
special tokens, counted while it is cut at them and refused once they reach the context
(:mod:`localspec.llama.special_split`, on a thread of its own, never the engine's).
"""

from __future__ import annotations

from typing import Optional

from .errors import bad_request

MAX_ITEMS = 10_000


def too_many_items(data) -> Optional[tuple[str, int]]:
    """(path, length) of the first list in ``data`` over MAX_ITEMS items."""
    todo: list[tuple[tuple, object]] = [((), data)]
    while todo:                                  # no recursion: any depth the parser took is fine
        path, value = todo.pop()
        if isinstance(value, dict):
            todo.extend(((*path, k), v) for k, v in value.items() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            if len(value) > MAX_ITEMS:
                return ".".join(str(p) for p in path) or "body", len(value)
            todo.extend(((*path, i), v) for i, v in enumerate(value) if isinstance(v, (dict, list)))
    return None


def check_items(data) -> None:
    """A 400 naming the first list of ``data`` longer than MAX_ITEMS (see the module's docstring)."""
    found = too_many_items(data)
    if found is not None:
        path, n = found
        raise bad_request(f"Invalid value for '{path}': {n} items, more than the {MAX_ITEMS} this server "
                          "takes in one list.", param=path, code="too_many_items")
