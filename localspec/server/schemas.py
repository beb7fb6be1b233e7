"""Request bodies of the OpenAI API, as far as this server honours them (pydantic).

Nothing is dropped silently: an unknown field is refused (400 naming it in ``param``). Fields that
do not change the answer are declared and accepted (:data:`HARMLESS`); fields that would change it
but cannot be honoured in every value (``n`` > 1, ``modalities`` other than text...) are refused in
:mod:`.params`. ``top_k``, ``min_p``, ``repeat_penalty`` and ``repeat_last_n`` are llama-server's
extensions; their ranges and descriptions, like every sampling field's, come from their
declarations in :mod:`localspec.core.options` (:func:`request_field`). The structured-output,
tool, logprob and prediction fields are nested models below.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..core.options import OPTIONS


def request_field(name: str):
    """The pydantic field of the request value declared as option ``name``: optional (the model's
    default applies), with the declared range as its constraints (JSON schema) and help as its
    description."""
    opt = OPTIONS[name]
    return Field(None, description=opt.help or None, **opt.constraints())


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


class _FunctionTyped(_Body):
    """A ``type`` that must be "function": a base listed last, so that pydantic (which takes the
    fields of the bases in reverse method-resolution order) checks it before every other field, and a
    refused ``{"type": "web_search"}`` names ``type``, not a missing ``name``."""

    type: Literal["function"]


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
    # localspec's: false keeps this request's text out of the recall every client drafts from, and
    # drafts nothing recalled for it (true cannot turn on what `serve --no-recall` turned off)
    recall: Optional[StrictBool] = request_field("recall")
    # localspec's: exact mode for this request (true or false; left out: the server's --rows-match or the
    # model's PARAMETER rows_match)
    rows_match: Optional[StrictBool] = request_field("rows_match")


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = request_field("max_tokens")
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


# -- the Responses API (/v1/responses) ----------------------------------------------------------------
class ResponseTool(FunctionDef, _FunctionTyped):
    """A chat tool's function flattened into the tool: ``type`` first, then FunctionDef's fields."""


class ResponseNamedTool(NamedFunction, _FunctionTyped):
    """A named tool choice, flattened as :class:`ResponseTool`."""


class ResponseTextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = Field(None, min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseText(_Body):
    format: Optional[ResponseTextFormat] = None


class ResponseInputMessage(_Body):
    """An ``input`` item with a ``role`` (``type`` "message", or left out)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[ContentPart]]
    id: Optional[str] = None
    status: Optional[str] = None


class ResponseFunctionCall(_Body):
    """An earlier answer's tool call, sent back in ``input``."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Optional[str] = None


class ResponseFunctionCallOutput(_Body):
    """A tool's result, answering the ``function_call`` of the same ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[ContentPart]]
    id: Optional[str] = None
    status: Optional[str] = None


INPUT_ITEMS = {"message": ResponseInputMessage, "function_call": ResponseFunctionCall,
               "function_call_output": ResponseFunctionCallOutput}


class ResponsesRequest(_Harmless):
    """``POST /v1/responses``. ``input`` items are checked one by one (:data:`INPUT_ITEMS`, by their
    ``type``) so that an error names the item; ``previous_response_id``, ``reasoning`` and
    ``background`` are declared to be refused by name (this server keeps no responses)."""

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[ResponseTool]] = None
    tool_choice: Union[Literal["auto", "none", "required"], ResponseNamedTool, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[ResponseText] = None
    max_output_tokens: Optional[int] = request_field("max_tokens")
    temperature: Optional[float] = request_field("temperature")
    top_p: Optional[float] = request_field("top_p")
    top_k: Optional[int] = request_field("top_k")
    min_p: Optional[float] = request_field("min_p")
    presence_penalty: Optional[float] = request_field("presence_penalty")
    frequency_penalty: Optional[float] = request_field("frequency_penalty")
    repeat_penalty: Optional[float] = request_field("repeat_penalty")
    repeat_last_n: Optional[int] = request_field("repeat_last_n")
    seed: Optional[int] = request_field("seed")
    rows_match: Optional[StrictBool] = request_field("rows_match")   # localspec's exact mode, as on chat
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    truncation: Optional[Literal["disabled"]] = None
    include: Optional[list[str]] = None               # only [] is honoured
    previous_response_id: Optional[str] = None        # refused: no response is stored
    reasoning: Optional[dict[str, Any]] = None        # refused unless empty
    background: Optional[bool] = None                 # refused when true
