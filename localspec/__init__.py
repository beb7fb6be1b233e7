"""localspec: EAGLE-3 / EAGLE-3.1 speculative decoding for local models on llama.cpp.

The Python API is the one the CLI and the TUI use::

    from localspec import Engine, GenerationConfig, Message, TokenEvent
    with Engine("target.gguf", drafter="drafter.gguf") as engine:
        for event in engine.generate([Message("user", "Hello")], GenerationConfig(max_tokens=64)):
            if isinstance(event, TokenEvent):
                print(event.text, end="", flush=True)
"""

from .chat_format import Message
from .engine import Engine, GenerationConfig
from .errors import LocalspecError
from .events import CycleEvent, DoneEvent, GenerationStats, TokenEvent
from .sampling import SamplingParams
from .speculation.policy import PolicyConfig

__all__ = [
    "CycleEvent", "DoneEvent", "Engine", "GenerationConfig", "GenerationStats", "LocalspecError",
    "Message", "PolicyConfig", "SamplingParams", "TokenEvent",
]
__version__ = "0.1.0"
