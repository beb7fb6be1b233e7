"""localspec: EAGLE-3 / EAGLE-3.1 speculative decoding for local models on llama.cpp.

The Python API is the one the CLI and the TUI use::

    from localspec import Engine, GenerationConfig, Message, TokenEvent
    with Engine("target.gguf", drafter="drafter.gguf") as engine:
        for event in engine.generate([Message("user", "Hello")], GenerationConfig(max_tokens=64)):
            if isinstance(event, TokenEvent):
                print(event.text, end="", flush=True)
"""

import importlib
from typing import TYPE_CHECKING

from .core import __version__  # spelled once, in the layer every other imports

# Imported on first use, so that `localspec` (the command) starts its Ctrl-C handling before the
# heavy imports (llama.cpp, numpy): a Ctrl-C during them is then "Interrupted.", not a traceback.
_EXPORTS = {
    "Message": ".formats.chat_format", "Engine": ".runtime.engine", "GenerationConfig": ".runtime.config", "LocalspecError": ".core.errors",
    "CycleEvent": ".core.events", "DoneEvent": ".core.events", "GenerationStats": ".core.events", "TokenEvent": ".core.events",
    "TokenLogprob": ".core.events",
    "SamplingParams": ".runtime.sampling", "PolicyConfig": ".speculation.policy",
}

if TYPE_CHECKING:  # pragma: no cover
    from .formats.chat_format import Message
    from .runtime.config import GenerationConfig
    from .runtime.engine import Engine
    from .core.errors import LocalspecError
    from .core.events import CycleEvent, DoneEvent, GenerationStats, TokenEvent, TokenLogprob
    from .runtime.sampling import SamplingParams
    from .speculation.policy import PolicyConfig

__all__ = [
    "CycleEvent", "DoneEvent", "Engine", "GenerationConfig", "GenerationStats", "LocalspecError",
    "Message", "PolicyConfig", "SamplingParams", "TokenEvent", "TokenLogprob",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
