"""Request bodies of the OpenAI API, as far as this server honours them (pydantic).

Unknown fields are ignored, as OpenAI-compatible servers do (clients send ``user``,
``stream_options``, ``tools``...); fields that would change the answer but cannot be honoured
(``n`` > 1, ``logprobs``) are refused in :mod:`.params`. ``top_k``, ``min_p``, ``repeat_penalty``
and ``repeat_last_n`` are llama-server's extensions. The sampling fields' ranges and descriptions
come from their declarations in :mod:`localspec.core.options` (:func:`request_field`).
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..core.options import OPTIONS


def request_field(name: str):
    """The pydantic field of the request value declared as option ``name``: optional (the model's
    default applies), with the declared range as its constraints (JSON schema) and help as its
    description."""
    opt = OPTIONS[name]
    return Field(None, description=opt.help or None, **opt.constraints())


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Body):
    type: str
    text: Optional[str] = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingRequest(_Body):
    """The fields both endpoints share."""

    model: Optional[str] = None
    max_tokens: Optional[int] = request_field("max_tokens")
    temperature: Optional[float] = request_field("temperature")
    top_p: Optional[float] = request_field("top_p")
    top_k: Optional[int] = request_field("top_k")
    min_p: Optional[float] = request_field("min_p")
    presence_penalty: Optional[float] = request_field("presence_penalty")
    frequency_penalty: Optional[float] = request_field("frequency_penalty")
    repeat_penalty: Optional[float] = request_field("repeat_penalty")
    repeat_last_n: Optional[int] = request_field("repeat_last_n")
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = request_field("seed")
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = request_field("top_logprobs")


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = request_field("max_tokens")


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str]]
    echo: bool = False
    suffix: Optional[str] = None
