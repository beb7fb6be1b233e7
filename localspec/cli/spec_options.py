"""The speculation options that ``generate``, ``bench``, ``serve`` and ``chat`` share (declared in
:mod:`localspec.core.options`, made Typer options by :mod:`.flags`)."""

from __future__ import annotations

from typing import Optional

import typer

from .flags import Policy, Source, Tree, option

__all__ = ["Policy", "Source", "Tree", "default_draft_max", "TreeOpt", "NoSpecOpt", "PolicyOpt", "DraftMaxOpt",
           "SourceOpt", "PMinOpt", "SPEC_OPTIONS"]

# the declared speculation options a command that runs a model takes (with_options(*SPEC_OPTIONS))
SPEC_OPTIONS = ("policy", "draft_max", "source", "tree", "p_min", "recall")


def default_draft_max(policy: Policy, draft_max: Optional[int]) -> int:
    """auto chooses the depth each cycle up to a generous cap; fixed always drafts the cap (the rule
    lives in localspec.runtime.generation_options, which every front end builds its config with)."""
    from ..runtime.generation_options import default_draft_max as rule

    return rule(policy, draft_max)


NoSpecOpt = typer.Option(False, "--no-spec", help="Plain decoding, no drafter.")
TreeOpt = option("tree")
PolicyOpt = option("policy")
DraftMaxOpt = option("draft_max")
SourceOpt = option("source")
PMinOpt = option("p_min")
