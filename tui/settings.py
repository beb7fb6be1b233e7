"""The chat's settings: the system prompt and what one reply is generated with (edited in the
settings screen, seeded by ``localspec chat``'s flags and a Modelfile's PARAMETERs)."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.runtime.engine import GenerationConfig
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from localspec.speculation.policy import PolicyConfig


@dataclass
class ChatSettings:
    system: str = ""
    max_tokens: int = 512
    temperature: float = CHAT_SAMPLING.temperature   # sampling, as llama.cpp and Ollama chat (0: greedy)
    top_k: int = CHAT_SAMPLING.top_k
    top_p: float = CHAT_SAMPLING.top_p
    policy: str = "auto"
    draft_max: int = PolicyConfig().draft_max  # auto chooses the depth up to this
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

    def config(self, spec: bool) -> GenerationConfig:
        return GenerationConfig(
            max_tokens=self.max_tokens,
            sampling=SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                    min_p=self.min_p, seed=self.seed, repeat_penalty=self.repeat_penalty,
                                    repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
                                    frequency_penalty=self.frequency_penalty),
            stop=tuple(self.stop),
            spec=spec,
            policy=PolicyConfig(name=self.policy, draft_max=self.draft_max, tree=self.tree, p_min=self.p_min),
        )
