"""Request bodies of the OpenAI API, as far as this server honours them (pydantic).

Unknown fields are ignored, as OpenAI-compatible servers do (clients send ``user``,
``stream_options``, ``tools``...); fields that would change the answer but cannot be honoured
(``n`` > 1, ``logprobs``) are refused in :mod:`.params`. ``top_k``, ``min_p``, ``repeat_penalty``
and ``repeat_last_n`` are llama-server's extensions.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


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
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, lt=1.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: Optional[float] = Field(None, gt=0.0)
    repeat_last_n: Optional[int] = Field(None, ge=-1)
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str]]
    echo: bool = False
    suffix: Optional[str] = None
