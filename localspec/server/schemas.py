"""Request bodies of the OpenAI API, as far as this server honours them (pydantic).

Nothing is dropped silently: an unknown field is refused (400 naming it in ``param``). Fields that
do not change the answer are declared and accepted (:data:`HARMLESS`); fields that would change it
but cannot be honoured in every value (``n`` > 1, ``modalities`` other than text...) are refused in
:mod:`.params`. ``top_k``, ``min_p``, ``repeat_penalty`` and ``repeat_last_n`` are llama-server's
extensions. The structured-output, tool, logprob and prediction fields are nested models below.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

# accepted and without effect on the answer: bookkeeping, routing and caching hints
HARMLESS = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(BaseModel):
    # an image / audio / file part carries its own keys; params refuses it by its type
    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class FunctionCall(_Body):
    name: str
    arguments: str = "{}"


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None       # an assistant's earlier calls
    tool_call_id: Optional[str] = None                # a tool message: the call it answers
    refusal: Optional[str] = None                     # an assistant's earlier refusal (as content)
    annotations: Optional[list[Any]] = None           # an earlier answer's citations: no effect
    # an earlier answer's fields echoed back by clients: accepted when null, else refused in params
    function_call: Optional[Any] = None
    audio: Optional[Any] = None


class JSONSchemaFormat(_Body):
    name: str = Field(min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaFormat] = None


class FunctionDef(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class Prediction(_Body):
    type: Literal["content"]
    content: Union[str, list[ContentPart]]


class _Harmless(_Body):
    """Fields accepted without effect (:data:`HARMLESS`)."""

    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None


class StreamOptions(_Body):
    include_usage: bool = False
    include_obfuscation: Optional[bool] = None        # no effect: this server sends no obfuscation


class SamplingRequest(_Harmless):
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
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    prediction: Optional[Prediction] = None
    modalities: Optional[list[str]] = None            # only ["text"] is honoured
    logit_bias: Optional[dict[str, float]] = None     # only {} is honoured


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None                     # only 1 is honoured
    logit_bias: Optional[dict[str, float]] = None     # only {} is honoured
