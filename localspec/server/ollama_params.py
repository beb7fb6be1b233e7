"""Ollama's request fields -> the OpenAI request this server already honours, so that both APIs
share one path (:func:`.params.chat_request`): the same template, grammar, tools and sampling, and
the same greedy text.

``options`` are Ollama's option names, which are the Modelfile PARAMETER names: each is checked
by the one PARAMETER table (:data:`localspec.formats.modelfile.PARAMETERS`, generated from
:mod:`localspec.core.options`), so its range and its error are those of a Modelfile. An option
this server cannot honour is refused with a 400 naming it, unless its value is Ollama's own
default, which changes nothing (:data:`NO_OP`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Optional

from pydantic import ValidationError

from ..formats.modelfile import PARAMETERS, check_parameter
from .errors import APIError, bad_request
from .ollama_schemas import ChatRequest, GenerateRequest, Message
from .schemas import ChatCompletionRequest, CompletionRequest

# Ollama option -> the OpenAI request field that does the same
HONOURED = {
    "num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
    "min_p": "min_p", "seed": "seed", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "stop": "stop",
    "rows_match": "rows_match",   # localspec's exact mode
}
# localspec's speculative PARAMETERs, per request -> the PolicyConfig field
SPECULATIVE = {"draft_max": "draft_max", "draft_policy": "name", "draft_p_min": "p_min", "draft_tree": "tree"}
# Ollama's options this server cannot honour, accepted at Ollama's default (which changes nothing)
NO_OP: dict[str, tuple] = {
    "mirostat": (0,), "mirostat_eta": (0.1,), "mirostat_tau": (5.0,), "typical_p": (1.0,), "tfs_z": (1.0,),
    "penalize_newline": (True,), "num_gpu": (-1,), "main_gpu": (0,), "num_thread": (0,), "num_batch": (512,),
    "use_mmap": (True, None), "use_mlock": (False,), "numa": (False,), "low_vram": (False,), "f16_kv": (True,),
    "vocab_only": (False,), "logits_all": (False,), "num_gqa": (None,),
}
# accepted in any value: they act only where this server never goes (a context shift)
NOT_APPLICABLE = ("num_keep",)


def refusal(name: str, why: str) -> APIError:
    return bad_request(f"option {name} {why}", param=f"options.{name}")


def _checked(name: str, value: Any) -> Any:
    """``value`` by the PARAMETER table's rules, or a 400 in its words (``option NAME must be ...``)."""
    try:
        if name == "stop" and isinstance(value, list):
            return [check_parameter(name, v) for v in value]
        return check_parameter(name, value)
    except ValueError as exc:
        raise bad_request(str(exc).replace("PARAMETER ", "option "), param=f"options.{name}") from None


def read_options(options: Optional[dict], n_ctx: int) -> tuple[dict, dict]:
    """(OpenAI request fields, PolicyConfig fields) from Ollama's ``options``; ``n_ctx``: the
    loaded model's context per request (``num_ctx`` may not ask for more)."""
    fields: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    for name, value in (options or {}).items():
        if name in NO_OP:
            if value not in NO_OP[name] or isinstance(value, bool) != isinstance(NO_OP[name][0], bool):
                raise refusal(name, f"is not supported by this server (only Ollama's default "
                                    f"{json.dumps(NO_OP[name][0])}, which changes nothing, is accepted).")
            continue
        if name in NOT_APPLICABLE:
            _checked(name, value)
            continue
        if name not in PARAMETERS:
            raise refusal(name, "is not an option this server knows (see the README's table of Ollama options).")
        value = _checked(name, value)
        if name == "num_ctx":
            if value > n_ctx:
                raise refusal(name, f"asks for a context of {value} tokens; this model is served with {n_ctx} "
                                    "(start `localspec serve` with a larger --ctx).")
        elif name in HONOURED:
            if name == "num_predict" and value in PARAMETERS[name].automatic:
                continue   # -1 / -2: no limit, the server's default
            fields[HONOURED[name]] = value
        elif name in SPECULATIVE:
            policy[SPECULATIVE[name]] = ("on" if value else "off") if name == "draft_tree" else value
        else:
            raise refusal(name, "is a load-time setting this server does not take per request.")
    return fields, policy


def with_policy(config, policy: dict):
    """``config`` with the request's speculative settings."""
    if not policy:
        return config
    try:
        return replace(config, policy=replace(config.policy, **policy))
    except Exception as exc:
        raise bad_request(f"options: {exc}", param="options") from None


def response_format(fmt) -> Optional[dict]:
    """Ollama's ``format`` ("json" or a JSON schema) as OpenAI's ``response_format``."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad_request(f"format must be \"json\" or a JSON schema, got {json.dumps(fmt)[:40]}.", param="format")


def check_extras(req, model: str) -> None:
    """The fields every generation takes that this server honours in some values only."""
    if req.think not in (None, False):
        raise bad_request(f"\"{model}\" does not support thinking (think must be false or left out).",
                          param="think")
    if req.logprobs:
        raise bad_request("logprobs is not supported on /api/ (use /v1/chat/completions).", param="logprobs")
    if req.top_logprobs:
        raise bad_request("top_logprobs is not supported on /api/ (use /v1/chat/completions).",
                          param="top_logprobs")


def _no_images(images, model: str, param: str) -> None:
    if images:
        raise bad_request(f"\"{model}\" does not support images: it is a text model (no vision projector).",
                          param=param)


def openai_messages(messages: list[Message], model: str) -> list[dict]:
    """Ollama's messages as OpenAI's. Ollama pairs a ``tool`` message with its call by ``tool_name``
    (or by order) rather than by id: one without ``tool_call_id`` gets the id of the preceding
    assistant's first unanswered call of that name, else of its first unanswered call."""
    out = []
    pending: list[tuple[str, str]] = []   # (id, name) of the last assistant's calls not answered yet
    for i, m in enumerate(messages):
        _no_images(m.images, model, f"messages.{i}.images")
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.id or f"call_{i}_{j}", "type": "function",
                                      "function": {"name": c.function.name,
                                                   "arguments": json.dumps(c.function.arguments, ensure_ascii=False)}}
                                     for j, c in enumerate(m.tool_calls)]
        if m.role == "tool":
            message["name"] = m.tool_name
            message["tool_call_id"] = m.tool_call_id or _answered(pending, m.tool_name)
            pending = [p for p in pending if p[0] != message["tool_call_id"]]
        else:
            pending = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls", ())]
        out.append(message)
    return out


def _answered(pending: list[tuple[str, str]], name: Optional[str]) -> Optional[str]:
    """The id of the pending call a tool result without an id answers (None: no call is pending)."""
    named = [call_id for call_id, call_name in pending if call_name == name]
    return (named or [call_id for call_id, _ in pending] or [None])[0]


def _validated(schema, body: dict):
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}." if param else first["msg"],
                          param=param) from None


def chat_body(req: ChatRequest, fields: dict, model: str) -> ChatCompletionRequest:
    """The OpenAI chat request that does what ``req`` asks."""
    check_extras(req, model)
    body: dict[str, Any] = {"model": model, "messages": openai_messages(req.messages, model), **fields}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.function.model_dump(exclude_none=True)}
                         for t in req.tools]
    fmt = response_format(req.format)
    if fmt is not None:
        body["response_format"] = fmt
    return _validated(ChatCompletionRequest, body)


def generate_body(req: GenerateRequest, fields: dict, model: str) -> ChatCompletionRequest | CompletionRequest:
    """``/api/generate`` as a chat of one user message (with ``system``) through the model's
    template, or, with ``raw``, as a text completion of the prompt as it is."""
    check_extras(req, model)
    _no_images(req.images, model, "images")
    if req.suffix:
        raise bad_request("suffix (fill-in-the-middle) is not supported by this server.", param="suffix")
    if req.context:
        raise bad_request("context (an earlier answer's token ids) is not supported: send the conversation "
                          "to /api/chat instead.", param="context")
    if req.template is not None:
        raise bad_request("a per-request template is not supported: create a model with it "
                          "(/api/create's template) and name that model.", param="template")
    fmt = response_format(req.format)
    if req.raw:
        if fmt is not None:
            raise bad_request("format needs the model's template (not raw).", param="format")
        return _validated(CompletionRequest, {"model": model, "prompt": req.prompt, **fields})
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": req.prompt}]
    body: dict[str, Any] = {"model": model, "messages": messages, **fields}
    if fmt is not None:
        body["response_format"] = fmt
    return _validated(ChatCompletionRequest, body)
