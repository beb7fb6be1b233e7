"""The chat's settings: the system prompt and what one reply is generated with (edited in the
settings screen, seeded by ``localspec chat``'s flags and a Modelfile's PARAMETERs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from localspec.runtime.engine import GenerationConfig
from localspec.runtime.generation_options import GenerationOptions, default_draft_max
from localspec.runtime.sampling import CHAT_SAMPLING
from localspec.speculation.policy import PolicyConfig


@dataclass
class ChatSettings:
    system: str = ""
    max_tokens: int = 512
    temperature: float = CHAT_SAMPLING.temperature   # sampling, as llama.cpp and Ollama chat (0: greedy)
    top_k: int = CHAT_SAMPLING.top_k
    top_p: float = CHAT_SAMPLING.top_p
    policy: str = "auto"
    draft_max: int | None = None   # None: the policy's default (auto chooses the depth up to 16, fixed drafts 4)
    # not in the settings dialog; a Modelfile's PARAMETERs (or chat's flags) set them
    min_p: float = CHAT_SAMPLING.min_p
    repeat_penalty: float = CHAT_SAMPLING.repeat_penalty
    repeat_last_n: int = CHAT_SAMPLING.repeat_last_n
    presence_penalty: float = CHAT_SAMPLING.presence_penalty
    frequency_penalty: float = CHAT_SAMPLING.frequency_penalty
    seed: int | None = None
    stop: tuple[str, ...] = ()
    tree: str = PolicyConfig().tree
    p_min: float = PolicyConfig().p_min

    @property
    def effective_draft_max(self) -> int:
        """The draft cap replies use: ``draft_max``, or the policy's default when it is None."""
        return default_draft_max(self.policy, self.draft_max)

    def options(self, spec: bool) -> GenerationOptions:
        return GenerationOptions.from_values(asdict(self), spec=spec)   # `system` is not a generation option

    def config(self, spec: bool) -> GenerationConfig:
        return self.options(spec).to_config()
