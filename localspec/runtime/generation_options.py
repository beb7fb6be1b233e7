"""What a user sets for one generation, by name, and the one place that turns it into the engine's
:class:`GenerationConfig` (its :class:`SamplingParams` and :class:`PolicyConfig`).

``localspec generate``, ``bench``, ``serve`` (each request), the chat's settings and the Python API
all build their configuration here, so a rule such as "policy fixed drafts 4 tokens unless told
otherwise" holds everywhere. The defaults and the value ranges are :mod:`localspec.core.options`'
(declared once, as the engine's ``SamplingParams``, ``PolicyConfig`` and ``GenerationConfig`` take
them); the ranges are checked when the configuration is built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, Optional

from ..core import options
from ..core.options import AUTO_DRAFT_MAX, FIXED_DRAFT_MAX  # noqa: F401 (FIXED_DRAFT_MAX: re-exported)
from .config import GenerationConfig
from .sampling import SamplingParams
from ..speculation.policy import PolicyConfig

_D = options.default


def default_draft_max(policy: Any, draft_max: Optional[int]) -> int:
    """auto chooses the depth each cycle up to a generous cap; fixed always drafts the cap."""
    if draft_max is not None:
        return draft_max
    return AUTO_DRAFT_MAX if _plain(policy) == "auto" else FIXED_DRAFT_MAX


def _plain(value: Any) -> Any:
    """A CLI enum (Policy.fixed) as its value ("fixed"); anything else as it is."""
    return value.value if isinstance(value, Enum) else value


@dataclass(frozen=True)
class GenerationOptions:
    """The user-facing values of one generation. ``draft_max=None``: the policy's default."""

    max_tokens: int = _D("max_tokens")
    temperature: float = _D("temperature")
    top_k: int = _D("top_k")
    top_p: float = _D("top_p")
    min_p: float = _D("min_p")
    seed: Optional[int] = _D("seed")
    repeat_penalty: float = _D("repeat_penalty")
    repeat_last_n: int = _D("repeat_last_n")
    presence_penalty: float = _D("presence_penalty")
    frequency_penalty: float = _D("frequency_penalty")
    stop: tuple[str, ...] = ()
    spec: bool = True
    policy: str = _D("policy")
    draft_max: Optional[int] = _D("draft_max")
    source: str = _D("source")
    tree: str = _D("tree")
    p_min: float = _D("p_min")
    probe_every: int = _D("probe_every")
    tree_width: int = _D("tree_width")
    tree_nodes: int = _D("tree_nodes")
    lookup_max: int = _D("lookup_max")
    recall: bool = _D("recall")
    rows_match: bool = _D("rows_match")
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
                            tree_width=self.tree_width, tree_nodes=self.tree_nodes, lookup_max=self.lookup_max,
                            recall=self.recall)

    def to_config(self) -> GenerationConfig:
        return GenerationConfig(max_tokens=self.max_tokens, sampling=self.sampling(), stop=tuple(self.stop),
                                spec=self.spec, policy=self.policy_config(), parse_special=self.parse_special,
                                rows_match=True if self.rows_match else None)   # off: the engine's default
