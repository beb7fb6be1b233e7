"""OpenAI request fields -> what the engine takes: the prompt (messages or raw text) and a
:class:`GenerationConfig`. Fields a request leaves out come from the model's Modelfile
PARAMETERs, then from the chat sampling defaults (:data:`localspec.runtime.sampling.CHAT_SAMPLING`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from ..formats.chat_format import ChatFormatter, Message
from ..runtime.engine import GenerationConfig
from ..runtime.generation_options import GenerationOptions
from ..core.errors import LocalspecError
from ..core.options import OPTIONS
from ..store.models import ModelSpec
from ..runtime.sampling import CHAT_SAMPLING, SamplingParams
from ..runtime.config import PolicyConfig   # GenerationConfig's policy: the server knows it through the runtime
from .errors import bad_request
from .features import (chat_logprobs, check_tool_answers, chat_tools, completion_logprobs, content_text, message_calls,
                       prediction_text, refuse_unhonoured, response_grammar, tool_grammar, with_features)
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest

# request field -> the SamplingParams field (and localspec.core.options entry) it sets, from the declarations
SAMPLING_FIELDS = {opt.field: opt.name for opt in OPTIONS.values()
                   if opt.field and opt.name in {f.name for f in fields(SamplingParams)}}
MAX_STOP = 16


@dataclass
class ServeDefaults:
    """What the server applies to every request: from the command line and the model."""

    n_ctx: int
    sampling: dict = field(default_factory=lambda: asdict(CHAT_SAMPLING))
    stop: tuple[str, ...] = ()
    max_tokens: Optional[int] = None       # None: until the context is full (OpenAI's default)
    spec: bool = True
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rows_match: bool = False               # exact mode unless a request says otherwise (--rows-match)

    @classmethod
    def for_model(cls, model: ModelSpec, *, n_ctx: int, max_tokens: Optional[int], spec_enabled: bool,
                  policy: PolicyConfig, rows_match: bool = False) -> "ServeDefaults":
        sampling = asdict(CHAT_SAMPLING)
        names = {f.name for f in fields(SamplingParams)}
        stop: tuple[str, ...] = ()
        for name, value in model.parameters.items():   # the Modelfile's PARAMETERs
            if name in names:
                sampling[name] = value
            elif name == "stop":
                stop = tuple(value)
            elif name == "num_predict" and max_tokens is None and int(value) > 0:
                max_tokens = int(value)
        try:
            SamplingParams(**sampling)
        except LocalspecError as exc:
            raise LocalspecError(f"the model's sampling PARAMETERs are invalid: {exc}") from None
        return cls(n_ctx=n_ctx, sampling=sampling, stop=stop, max_tokens=max_tokens, spec=spec_enabled,
                   policy=policy, rows_match=rows_match)


def _refuse_unsupported(req: SamplingRequest) -> None:
    if req.n is not None and req.n != 1:
        raise bad_request("n must be 1: this server generates one choice per request.", param="n")
    refuse_unhonoured(req)


def _stop(req: SamplingRequest, default: tuple[str, ...]) -> tuple[str, ...]:
    if req.stop is None:
        return default
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if len(stop) > MAX_STOP:
        raise bad_request(f"at most {MAX_STOP} stop strings are supported.", param="stop")
    return tuple(s for s in stop if s)


def checked(field: str, value):
    """A request value in the range declared for it (localspec.core.options), or a 400 naming the
    field in ``param``."""
    try:
        return OPTIONS[SAMPLING_FIELDS.get(field, field)].check(value)
    except LocalspecError as exc:
        raise bad_request(str(exc), param=field) from None


def sampling_params(req: SamplingRequest, defaults: ServeDefaults) -> SamplingParams:
    values = dict(defaults.sampling)
    for field_name, name in SAMPLING_FIELDS.items():
        value = getattr(req, field_name)
        if value is None:
            continue
        if name not in values:
            raise bad_request(f"{field_name} is not supported by this server.", param=field_name)
        values[name] = checked(field_name, value)
    try:
        return SamplingParams(**values)
    except LocalspecError as exc:
        raise bad_request(str(exc)) from None


def generation_config(req: SamplingRequest, defaults: ServeDefaults, max_tokens: Optional[int]) -> GenerationConfig:
    _refuse_unsupported(req)
    limit = max_tokens or defaults.max_tokens or defaults.n_ctx   # the engine stops at the context's end
    try:
        return GenerationOptions.from_config(sampling_params(req, defaults), defaults.policy, max_tokens=limit,
                                             stop=_stop(req, defaults.stop), spec=defaults.spec,
                                             recall=defaults.policy.recall and req.recall is not False,
                                             rows_match=defaults.rows_match if req.rows_match is None
                                             else req.rows_match).to_config()
    except LocalspecError as exc:
        raise bad_request(str(exc)) from None


def chat_messages(req: ChatCompletionRequest, model: ModelSpec, *, paired: bool = True) -> list[Message]:
    """The conversation to render: the Modelfile's SYSTEM and MESSAGEs first unless the request
    brings its own system message (as Ollama does), then the request's messages (text, and an
    assistant's tool calls, a tool result's call id). ``paired``: OpenAI's rule that every call is
    answered by its id is checked (Ollama's API pairs results by name and order, and takes fewer)."""
    if paired:
        check_tool_answers(req.messages)
    out: list[Message] = []
    for i, message in enumerate(req.messages):
        for name in ("function_call", "audio"):
            if getattr(message, name) is not None:
                raise bad_request(f"A message's {name} is not supported here (send tool_calls, text content).",
                                  param=f"messages[{i}].{name}")
        text = content_text(message.content, f"messages[{i}].content")
        if message.role == "assistant" and not text and message.refusal:
            text = message.refusal
        role = "system" if message.role == "developer" else message.role
        out.append(Message(role, text, tool_calls=message_calls(message, i), tool_call_id=message.tool_call_id,
                           name=message.name if role == "tool" else None))
    if not any(m.role == "system" for m in out):
        preset = [Message("system", model.system)] if model.system else []
        out = preset + [Message(role, content) for role, content in model.messages] + out
    return out


def chat_request(req: ChatCompletionRequest, model: ModelSpec, defaults: ServeDefaults,
                 formatter: Optional[ChatFormatter] = None, *, paired: bool = True):
    """(prompt, config, tools): the prompt is the messages, or the text the server rendered itself
    when tools are involved (``formatter``: the engine's chat template); ``tools`` is None then not.
    ``paired``: see :func:`chat_messages`."""
    messages = chat_messages(req, model, paired=paired)
    config = generation_config(req, defaults, req.max_completion_tokens or req.max_tokens)
    tools = chat_tools(req, formatter.source if formatter is not None else "")
    grammar, triggers = tool_grammar(tools)
    response = response_grammar(req)
    if response is not None and grammar is not None:
        raise bad_request("response_format cannot be combined with tools (unless tool_choice is \"none\").",
                          param="response_format")
    config = with_features(config, grammar=grammar or response, grammar_triggers=triggers,
                           logprobs=chat_logprobs(req), prediction=prediction_text(req))
    if tools is None:
        return messages, config, None
    if formatter is None:
        raise bad_request("tools need the model's chat template.", param="tools")
    try:
        return tools.render(formatter, messages), config, tools
    except LocalspecError as exc:
        raise bad_request(str(exc), param="messages") from None


def completion_request(req: CompletionRequest, defaults: ServeDefaults):
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad_request("prompt must be one string: batches of prompts are not supported.", param="prompt")
        prompt = prompt[0]
    if req.suffix:
        raise bad_request("suffix (fill-in-the-middle) is not supported by this server.", param="suffix")
    config = generation_config(req, defaults, req.max_tokens)
    return prompt, with_features(config, logprobs=completion_logprobs(req))
