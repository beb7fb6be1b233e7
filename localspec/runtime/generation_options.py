"""What a user sets for one generation, by name, and the one place that turns it into the engine's
:class:`GenerationConfig` (its :class:`SamplingParams` and :class:`PolicyConfig`).

``localspec generate``, ``bench``, ``serve`` (each request), the chat's settings and the Python API
all build their configuration here, so a rule such as "policy fixed drafts 4 tokens unless told
otherwise" holds everywhere. The defaults are the engine's own (``SamplingParams``, ``PolicyConfig``,
``GenerationConfig``); the value ranges are :mod:`localspec.core.options`', checked when the
configuration is built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, Optional

from .engine import GenerationConfig
from .sampling import SamplingParams
from ..speculation.policy import PolicyConfig

_SAMPLING = SamplingParams()
_POLICY = PolicyConfig()
FIXED_DRAFT_MAX = 4   # policy fixed drafts this many tokens each cycle unless draft_max is given


def default_draft_max(policy: Any, draft_max: Optional[int]) -> int:
    """auto chooses the depth each cycle up to a generous cap; fixed always drafts the cap."""
    if draft_max is not None:
        return draft_max
    return _POLICY.draft_max if _plain(policy) == "auto" else FIXED_DRAFT_MAX


def _plain(value: Any) -> Any:
    """A CLI enum (Policy.fixed) as its value ("fixed"); anything else as it is."""
    return value.value if isinstance(value, Enum) else value


@dataclass(frozen=True)
class GenerationOptions:
    """The user-facing values of one generation. ``draft_max=None``: the policy's default."""

    max_tokens: int = GenerationConfig.max_tokens
    temperature: float = _SAMPLING.temperature
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    min_p: float = _SAMPLING.min_p
    seed: Optional[int] = _SAMPLING.seed
    repeat_penalty: float = _SAMPLING.repeat_penalty
    repeat_last_n: int = _SAMPLING.repeat_last_n
    presence_penalty: float = _SAMPLING.presence_penalty
    frequency_penalty: float = _SAMPLING.frequency_penalty
    stop: tuple[str, ...] = ()
    spec: bool = True
    policy: str = _POLICY.name
    draft_max: Optional[int] = None
    source: str = _POLICY.source
    tree: str = _POLICY.tree
    p_min: float = _POLICY.p_min
    probe_every: int = _POLICY.probe_every
    tree_width: int = _POLICY.tree_width
    tree_nodes: int = _POLICY.tree_nodes
    parse_special: bool = True

    @classmethod
    def from_values(cls, values: dict, **more: Any) -> "GenerationOptions":
        """From a dict of option values by name (e.g. the CLI's, after the Modelfile's PARAMETERs);
        names that are not generation options (ctx, threads, ...) are left out."""
        names = {f.name for f in fields(cls)}
        given = {k: _plain(v) for k, v in {**values, **more}.items() if k in names}
        if "stop" in given:
            given["stop"] = tuple(given["stop"])
        return cls(**given)

    @classmethod
    def from_config(cls, sampling: SamplingParams | dict, policy: PolicyConfig, **more: Any) -> "GenerationOptions":
        """From the engine's parts (what the server keeps per model) plus ``more`` by name."""
        values = dict(sampling) if isinstance(sampling, dict) else asdict(sampling)
        values.update({('policy' if k == 'name' else k): v for k, v in asdict(policy).items()})
        return cls.from_values(values, **more)

    def sampling(self) -> SamplingParams:
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(SamplingParams)})

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(name=self.policy, draft_max=default_draft_max(self.policy, self.draft_max),
                            source=self.source, tree=self.tree, p_min=self.p_min, probe_every=self.probe_every,
                            tree_width=self.tree_width, tree_nodes=self.tree_nodes)

    def to_config(self) -> GenerationConfig:
        return GenerationConfig(max_tokens=self.max_tokens, sampling=self.sampling(), stop=tuple(self.stop),
                                spec=self.spec, policy=self.policy_config(), parse_special=self.parse_special)
