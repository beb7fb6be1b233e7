"""Ollama's request fields -> the OpenAI request this server already honours, so that both APIs
share one path (:func:`..params.chat_request`): the same template, grammar, tools and sampling, and
the same greedy text.

``options`` are Ollama's option names, which are the Modelfile PARAMETER names: each is checked
by the one PARAMETER table (:data:`localspec.formats.modelfile.PARAMETERS`, generated from
:mod:`localspec.core.options`), so its range and its error are those of a Modelfile. An option
this server cannot honour is refused with a 400 naming it, unless its value is Ollama's own
default, which changes nothing (:data:`NO_OP`).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, Optional

from ...core.options import TOP_LOGPROBS_MAX
from ...formats.modelfile import PARAMETERS, check_parameter
from ..bodies import validated
from ..errors import APIError, bad_request
from ..schemas import ChatCompletionRequest, CompletionRequest
from .common import refused
from .schemas import ChatRequest, GenerateRequest, Message

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


# a field of the OpenAI request an /api request runs as -> the /api field that set it
OLLAMA_FIELDS = {"response_format": "format", "max_completion_tokens": "options.num_predict",
                 **{field: f"options.{option}" for option, field in HONOURED.items()}}


def in_ollamas_words(exc: APIError) -> APIError:
    """An error of the shared chat path, naming the ``/api`` field the client sent (``format``, not
    ``response_format``; ``options.num_predict``, not ``max_tokens``; ``messages.1.content``)."""
    if exc.param is None:
        return exc
    head = re.split(r"[.\[]", exc.param, maxsplit=1)[0]
    field = OLLAMA_FIELDS.get(head)
    param = (field + exc.param[len(head):] if field else exc.param).replace("[", ".").replace("]", "")
    message = exc.message.replace(head, field) if field and head in exc.message else exc.message
    if param not in message and (field or head) not in message:
        message = f"{param}: {message}"
    exc.param, exc.message = param, message
    return exc


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
            raise refusal(name, "is not an option this server knows (see docs/server.md's table of Ollama options).")
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
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= TOP_LOGPROBS_MAX:
        raise bad_request(f"top_logprobs must be between 0 and {TOP_LOGPROBS_MAX}.", param="top_logprobs")


def logprob_fields(req, completion: bool = False) -> dict:
    """Ollama's ``logprobs`` (and ``top_logprobs``, which counts only with it, as in Ollama) as the
    OpenAI request's fields: the same recorder answers both APIs."""
    if not req.logprobs:
        return {}
    top = req.top_logprobs or 0
    return {"logprobs": top} if completion else {"logprobs": True, "top_logprobs": top}


def _no_images(images, model: str, param: str) -> None:
    if images:
        raise bad_request(f"\"{model}\" does not support images: it is a text model (no vision projector).",
                          param=param)


def openai_messages(messages: list[Message], model: str) -> list[dict]:
    """Ollama's messages as OpenAI's. Ollama pairs a ``tool`` message with its call by ``tool_name``
    (or by order) rather than by id: one without ``tool_call_id`` gets the id of the preceding
    assistant's first unanswered call of that name, else of its first unanswered call, else none.
    A call left unanswered is fine, as in Ollama (the conversation is not checked by OpenAI's
    rule, :func:`..params.chat_request` with ``paired=False``). ``content: null`` reads as ""."""
    out = []
    pending: list[tuple[str, str]] = []   # (id, name) of the last assistant's calls not answered yet
    for i, m in enumerate(messages):
        _no_images(m.images, model, f"messages.{i}.images")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
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
    return validated(schema, body, refused)


def prefill(req: ChatRequest) -> Optional[str]:
    """The text an assistant message last in the conversation begins the answer with (Ollama
    continues it), or None when the conversation ends otherwise."""
    last = req.messages[-1] if req.messages else None
    if last is None or last.role != "assistant" or last.tool_calls:
        return None
    return last.content or ""


def chat_body(req: ChatRequest, fields: dict, model: str) -> ChatCompletionRequest:
    """The OpenAI chat request that does what ``req`` asks (a last assistant message, which is
    continued, left out: see :func:`prefill`)."""
    check_extras(req, model)
    messages = req.messages[:-1] if prefill(req) is not None else req.messages
    body: dict[str, Any] = {"model": model, "messages": openai_messages(messages, model), **fields,
                            **logprob_fields(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.function.model_dump(exclude_none=True)}
                         for t in req.tools]
    fmt = response_format(req.format)
    if fmt is not None:
        body["response_format"] = fmt
    return _validated(ChatCompletionRequest, body)


def generate_body(req: GenerateRequest, fields: dict, model: str,
                  text: Optional[str] = None) -> ChatCompletionRequest | CompletionRequest:
    """``/api/generate`` as a chat of one user message (with ``system``) through the model's
    template, or, with ``raw`` (or ``text``: a prompt already made, fill-in-the-middle's), as a text
    completion of the prompt as it is."""
    check_extras(req, model)
    _no_images(req.images, model, "images")
    if req.template is not None:
        raise bad_request("a per-request template is not supported: create a model with it "
                          "(/api/create's template) and name that model.", param="template")
    if (req.raw or text is not None) and req.context:
        raise bad_request(f"context needs the model's template (not {'raw' if req.raw else 'suffix'}): "
                          "a raw or fill-in-the-middle prompt is sent as it is; put the earlier text in it.",
                          param="context")
    fmt = response_format(req.format)
    if req.raw or text is not None:
        if fmt is not None:
            raise bad_request(f"format needs the model's template (not {'raw' if req.raw else 'suffix'}).",
                              param="format")
        return _validated(CompletionRequest, {"model": model, "prompt": req.prompt if text is None else text,
                                              **fields, **logprob_fields(req, completion=True)})
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": req.prompt}]
    body: dict[str, Any] = {"model": model, "messages": messages, **fields, **logprob_fields(req)}
    if fmt is not None:
        body["response_format"] = fmt
    return _validated(ChatCompletionRequest, body)
