"""The built-in draft sources, registered in this order (text sources are asked by their
``order``; statistics classes are numbered in registration order).

A new source: its module (a :class:`~.sources.TextSource` or :class:`~.sources.ModelSource`
subclass) and its line below. Nothing else: the policy, the draft step, ``--source`` (the
source's ``switch`` word) and the stats know it by its name.
"""

from __future__ import annotations

from .block_source import DFlashSource, DSparkSource
from .lookup import LookupSource
from .model_source import AssistantSource, EagleSource, MtpSource
from .prediction import PredictedText
from .recall import RecallSource
from .sources import register, registered

BUILTIN = (
    LookupSource,
    PredictedText,
    RecallSource,
    EagleSource,
    MtpSource,
    AssistantSource,
    DFlashSource,
    DSparkSource,
)

for _source in BUILTIN:
    register(_source)

__all__ = ["BUILTIN", "register", "registered"]
