"""A speculative generation leaves nothing in the engine that a plain one would not.

Found while testing the server's logprobs: a plain request's first-token logprob moved by about 0.1
after an EAGLE request on another prompt. The cause is not the drafter: the next prompt reused a
3-token KV prefix that the other prompt's prefill had written in a 226-token batch, where a fresh
prefill writes it in a 40-token batch, and llama.cpp's CPU kernels round rows differently by batch
shape (a plain generation of the other prompt moves the logits exactly as much). So the check is:
after the same prompt generated plainly or with EAGLE drafts, the next request's logits agree."""

from __future__ import annotations

from dataclasses import asdict


from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.formats.tool_calls import FORMATS, Tool, ToolRequest
from localspec.runtime.config import GenerationConfig
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from localspec.speculation.policy import PolicyConfig
from serve_checks import reference  # noqa: F401  (a fixture: the engine as the server builds it)

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


def test_a_speculative_generation_leaves_no_trace_in_the_next_ones_logits(reference):
    fmt = FORMATS["generic"]
    other = reference.formatter.render_variables(
        fmt.render_variables([Message("user", "What is the weather like in Paris right now?")],
                             ToolRequest((WEATHER,), "required", False)))
    after = {}
    for spec in (False, True):
        reference.verifier.forget()     # both write the other prompt's KV from position 0, in one batch
        config = GenerationConfig(max_tokens=80, sampling=GREEDY, policy=POLICY, spec=spec)
        done = [e for e in reference.generate(other, config) if isinstance(e, DoneEvent)][0]
        assert done.stats.drafted > 0 or not spec   # the EAGLE run did draft
        after[spec] = margins(reference)
    assert all(abs(a - b) < 1e-3 for a, b in zip(after[True], after[False])), after
