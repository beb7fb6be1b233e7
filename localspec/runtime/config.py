"""What one generation is asked for: :class:`GenerationConfig`.

Its own module so that the engine and the generation loop both import it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..core import options
from ..core.errors import LocalspecError
from ..speculation.policy import PolicyConfig
from .sampling import SamplingParams

# the policy a GenerationConfig carries: the layers above the runtime (server, chat) name it from here
__all__ = ["GenerationConfig", "PolicyConfig", "SamplingParams"]


@dataclass
class GenerationConfig:
    max_tokens: int = options.default("max_tokens")
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    spec: bool = True                      # speculate: the drafter when loaded and/or n-gram lookup
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    record_margins: bool = False           # keep each token's top-1 minus top-2 logit (bench)
    parse_special: bool = True             # a raw str prompt: "<|im_start|>" etc. become special tokens
    # structured output: a GBNF grammar (root rule ``root``) every emitted token keeps the text inside
    grammar: str | None = None
    # a lazy grammar: it applies only from the first occurrence of one of these words in the output
    # (a tool call's opening tag under tool_choice "auto"); empty: the grammar applies from the start
    grammar_triggers: Sequence[str] = ()
    # each emitted token's log-probability under the target, with this many most probable
    # alternatives (0..20); None: none recorded
    logprobs: int | None = None
    # Predicted Outputs: text the answer is expected to repeat (the file being edited), a draft source
    prediction: str | None = None
    # the prediction's tokens, when tokenized already (:meth:`Engine.prediction_tokens`: the server
    # does it off the engine thread); None: tokenized when the generation starts
    prediction_tokens: tuple | None = field(default=None, repr=False, compare=False)
    # exact mode (runtime.batch): every row of this generation's batches on one attention path, so
    # greedy text is the same with and without drafts and whatever ran before or beside it; None:
    # the engine's default (Engine(rows_match=...))
    rows_match: bool | None = None

    def __post_init__(self) -> None:
        # ranges: localspec.core.options; the policy and sampling values check themselves
        self.max_tokens = options.check("max_tokens", self.max_tokens)
        self.stop = options.check_stop(self.stop)
        if not isinstance(self.sampling, SamplingParams):
            raise LocalspecError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        if not isinstance(self.policy, PolicyConfig):
            raise LocalspecError(f"policy must be PolicyConfig, got {type(self.policy).__name__}")
        if self.grammar is not None:
            options.check_text("the grammar", self.grammar)
        self.grammar_triggers = options.check_stop(self.grammar_triggers)
        if self.grammar_triggers and self.grammar is None:
            raise LocalspecError("grammar_triggers need a grammar")
        if self.logprobs is not None:
            self.logprobs = options.check("top_logprobs", self.logprobs)
        if self.prediction is not None:
            options.check_text("the prediction", self.prediction)
        if self.rows_match is not None:
            self.rows_match = options.check("rows_match", self.rows_match)
