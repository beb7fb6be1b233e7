"""The chat's settings: the system prompt and what one reply is generated with (edited in the
settings screen, seeded by ``localspec chat``'s flags and a Modelfile's PARAMETERs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from localspec.core import options
from localspec.runtime.config import GenerationConfig
from localspec.runtime.generation_options import GenerationOptions, default_draft_max


_C = options.chat_default   # the chat's defaults: localspec.core.options, declared once with each range


@dataclass
class ChatSettings:
    system: str = ""
    max_tokens: int = _C("max_tokens")
    temperature: float = _C("temperature")   # sampling, as llama.cpp and Ollama chat (0: greedy)
    top_k: int = _C("top_k")
    top_p: float = _C("top_p")
    policy: str = _C("policy")
    draft_max: int | None = _C("draft_max")   # None: the policy's default (auto chooses the depth, fixed a set depth)
    min_p: float = _C("min_p")
    repeat_penalty: float = _C("repeat_penalty")
    repeat_last_n: int = _C("repeat_last_n")
    presence_penalty: float = _C("presence_penalty")
    frequency_penalty: float = _C("frequency_penalty")
    rows_match: bool = _C("rows_match")      # exact mode: greedy text as plain decoding gives it, whatever ran before
    # not in the settings dialog; a Modelfile's PARAMETERs (or chat's flags) set them
    seed: int | None = _C("seed")
    stop: tuple[str, ...] = ()
    tree: str = _C("tree")
    p_min: float = _C("p_min")

    @property
    def effective_draft_max(self) -> int:
        """The draft cap replies use: ``draft_max``, or the policy's default when it is None."""
        return default_draft_max(self.policy, self.draft_max)

    def options(self, spec: bool) -> GenerationOptions:
        return GenerationOptions.from_values(asdict(self), spec=spec)   # `system` is not a generation option

    def config(self, spec: bool) -> GenerationConfig:
        return self.options(spec).to_config()
