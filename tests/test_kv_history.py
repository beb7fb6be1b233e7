"""A generation's logits do not depend on what the engine generated before (beyond the last bits
of batched arithmetic). Found while testing the server's logprobs (issue 27): a plain request's
first-token logprob moved by 0.1 after a speculative request on another prompt. It takes the EAGLE
drafter (n-gram lookup alone leaves no trace) and was already so at ac5d953; expected to fail until
the runtime is mended (strict: a fix makes this test fail as XPASS, then drop the mark)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.formats.tool_calls import FORMATS, Tool, ToolRequest
from localspec.runtime.config import GenerationConfig
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from localspec.speculation.policy import PolicyConfig
from test_serve import reference  # noqa: F401  (a fixture: the engine as the server builds it)

GREEDY = SamplingParams(**{**asdict(CHAT_SAMPLING), "temperature": 0.0})
POLICY = PolicyConfig(name="fixed", draft_max=4)
QUESTION = [Message("user", "Name three colours of the rainbow.")]
WEATHER = Tool("get_weather", "The current weather in a city",
               {"type": "object", "properties": {"city": {"enum": ["Paris", "London", "Tokyo"], "type": "string"},
                                                 "unit": {"enum": ["celsius", "fahrenheit"], "type": "string"}},
                "required": ["city", "unit"], "additionalProperties": False})


def margins(engine) -> list[float]:
    config = GenerationConfig(max_tokens=4, sampling=GREEDY, policy=POLICY, spec=False, record_margins=True)
    return [e for e in engine.generate(QUESTION, config) if isinstance(e, DoneEvent)][0].margins


@pytest.mark.xfail(strict=True, reason="the target's logits change after an EAGLE generation (a runtime bug)")
def test_a_speculative_generation_leaves_no_trace_in_the_next_ones_logits(reference):
    fmt = FORMATS["generic"]
    other = reference.formatter.render_variables(
        fmt.render_variables([Message("user", "What is the weather like in Paris right now?")],
                             ToolRequest((WEATHER,), "required", False)))
    before = margins(reference)
    for spec in (False, True):
        config = GenerationConfig(max_tokens=80, sampling=GREEDY, policy=POLICY, spec=spec)
        list(reference.generate(other, config))
        after = margins(reference)
        assert all(abs(a - b) < 1e-3 for a, b in zip(after, before)), (spec, before, after)
