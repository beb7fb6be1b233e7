"""Request bodies of Ollama's API (``docs/api.md``, ``api/types.go``), as far as this server
honours them. An unknown field is refused (400 naming it), as on ``/v1``; what a field may hold
is checked in :mod:`.params`."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

KeepAlive = Union[str, int, float, None]
Format = Union[str, dict[str, Any], None]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: Optional[int] = None
    description: Optional[str] = None


class ToolCall(_Body):
    function: FunctionCall
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str] = None           # null reads as "", as in Ollama
    images: Optional[list[str]] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[str] = None          # a tool message: the tool whose result it is
    tool_call_id: Optional[str] = None
    thinking: Optional[str] = None           # an earlier answer's thinking, echoed back


class FunctionDef(_Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef
    items: Optional[Any] = None


class _Generating(_Body):
    model: str = Field(min_length=1)
    format: Format = None
    options: Optional[dict[str, Any]] = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Union[bool, str, None] = None
    logprobs: Optional[bool] = None          # each token's logprob, Ollama's shape
    top_logprobs: Optional[int] = None       # alternatives per token (with logprobs)
    truncate: Optional[bool] = None          # no effect: a prompt longer than the context is an error
    shift: Optional[bool] = None             # no effect: the context never shifts here


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: Optional[list[Tool]] = None


class GenerateRequest(_Generating):
    prompt: str = ""
    suffix: Optional[str] = None
    images: Optional[list[str]] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[list[int]] = None
    raw: bool = False


class ModelRequest(_Body):
    """/api/show, /api/delete: ``model`` (older clients send ``name``)."""

    model: Optional[str] = None
    name: Optional[str] = None
    verbose: bool = False

    def target(self) -> Optional[str]:
        return self.model or self.name


class PullRequest(ModelRequest):
    insecure: bool = False
    stream: bool = True
    username: Optional[str] = None
    password: Optional[str] = None


class CopyRequest(_Body):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class CreateRequest(_Body):
    model: Optional[str] = None
    name: Optional[str] = None
    from_: Optional[str] = Field(None, alias="from")
    draft: Optional[str] = None              # localspec's own: the drafter (a Modelfile's DRAFT)
    parameters: Optional[dict[str, Any]] = None
    template: Optional[str] = None
    system: Optional[str] = None
    messages: Optional[list[Message]] = None
    license: Union[str, list[str], None] = None
    stream: bool = True
    quantize: Optional[str] = None           # refused: localspec does not requantize
    files: Optional[dict[str, str]] = None   # refused: blobs are not uploaded here
    adapters: Optional[dict[str, str]] = None
    modelfile: Optional[str] = None          # older clients: the Modelfile's text
    path: Optional[str] = None
