"""The speculation options that ``generate``, ``bench``, ``serve`` and ``chat`` share."""

from __future__ import annotations

from enum import Enum
from typing import Optional

import typer

from ..speculation.policy import PolicyConfig


class Policy(str, Enum):
    auto = "auto"
    fixed = "fixed"


def default_draft_max(policy: Policy, draft_max: Optional[int]) -> int:
    """auto chooses the depth each cycle up to a generous cap; fixed always drafts the cap (the rule
    lives in localspec.runtime.generation_options, which every front end builds its config with)."""
    from ..runtime.generation_options import default_draft_max as rule

    return rule(policy, draft_max)


class Source(str, Enum):
    auto = "auto"
    eagle = "eagle"
    lookup = "lookup"


class Tree(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


TreeOpt = typer.Option(Tree.auto, "--tree",
                       help="Drafter trees: auto (where the cost model says width is nearly free, as on GPUs), "
                            "on (always), off (chains only).")


NoSpecOpt = typer.Option(False, "--no-spec", help="Plain decoding, no drafter.")
PolicyOpt = typer.Option(Policy.auto, "--policy", help="auto: adaptive; fixed: always draft --draft-max.")
DraftMaxOpt = typer.Option(None, "--draft-max", show_default=False,
                           help="Most tokens drafted per cycle (default: auto 16, fixed 4).")
SourceOpt = typer.Option(Source.auto, "--source", help="Draft source: auto (drafter and n-gram lookup), eagle, lookup.")
PMinOpt = typer.Option(PolicyConfig.p_min, "--p-min", help="auto: the drafter stops drafting below this confidence.")
