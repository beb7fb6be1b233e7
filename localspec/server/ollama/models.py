"""Ollama's model routes over localspec's store: ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/version``, ``/api/pull`` (the catalog's names, NDJSON progress), ``/api/copy``,
``/api/delete`` and ``/api/create`` (``from``, ``parameters``, ``template``, ``system``,
``messages``, ``license`` and localspec's ``draft``). A model that is deleted or created again
while loaded is unloaded first (its requests end with 503)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ...core import __version__
from ...core.errors import LocalspecError, NotFound
from ...core.names import RULE, is_model_name, shown, without_latest
from ...formats import modelfile as mfmod
from ...formats.gguf_info import read_gguf
from ...formats.tool_calls import detect_format
from ...store import registry
from ...store.models import ModelSpec
from ..answering import ndjson, ndjson_stream
from ..bodies import check_key
from ..errors import APIError, ModelError, bad_request
from ..models_manager import ModelManager, store_names, unknown
from .common import read
from .schemas import CopyRequest, CreateRequest, ModelRequest, PullRequest

# the Ollama version this API follows (clients check it is recent enough: VS Code wants >= 0.6.4)
OLLAMA_VERSION = "0.13.0"
# llama.cpp's LLAMA_FTYPE_MOSTLY_* (general.file_type) -> Ollama's quantization_level
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}
LONG_ARRAY = 32   # model_info: longer arrays (the tokenizer's) are null unless verbose, as in Ollama


# -- what a model is, in Ollama's words --------------------------------------------------------------
def _files(spec: ModelSpec) -> list[Path]:
    return [Path(p) for p in (spec.target, spec.drafter) if p is not None and Path(p).is_file()]


def digest(spec: ModelSpec) -> str:
    """A stand-in for Ollama's manifest digest: the files' paths, sizes and times (not their bytes)."""
    h = hashlib.sha256()
    for p in _files(spec):
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _modified(name: str, spec: ModelSpec) -> str:
    record = registry.load(name)
    if record is not None:
        return record.created
    files = _files(spec)
    t = max((p.stat().st_mtime for p in files), default=0.0)
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _parameter_size(info) -> str:
    label = info.metadata.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    n = 0
    for t in info.tensors.values():
        count = 1
        for d in t.shape:
            count *= int(d)
        n += count
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _quantization(info) -> str:
    ftype = info.metadata.get("general.file_type")
    if isinstance(ftype, int) and ftype in FILE_TYPES:
        return FILE_TYPES[ftype]
    sizes: dict[str, int] = {}
    for t in info.tensors.values():
        if len(t.shape) >= 2:
            sizes[t.type_name] = sizes.get(t.type_name, 0) + t.n_bytes
    return max(sizes, key=sizes.get).upper() if sizes else "unknown"


def details(spec: ModelSpec, info=None) -> dict:
    info = info or read_gguf(spec.target)   # a loaded model's: read when it loaded (its file may be gone)
    return {"parent_model": "", "format": "gguf", "family": info.arch, "families": [info.arch],
            "parameter_size": _parameter_size(info), "quantization_level": _quantization(info)}


def entry(name: str, spec: ModelSpec) -> dict:
    """One model of ``/api/tags``."""
    return {"name": f"{name}:latest", "model": f"{name}:latest", "modified_at": _modified(name, spec),
            "size": sum(p.stat().st_size for p in _files(spec)), "digest": digest(spec), "details": details(spec)}


def _json_value(value: Any, verbose: bool) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_json_value(v, verbose) for v in value] if verbose or len(value) <= LONG_ARRAY else None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return None
    return value


def model_info(spec: ModelSpec, verbose: bool, info=None) -> dict:
    info = info or read_gguf(spec.target)
    out = {k: _json_value(v, verbose) for k, v in sorted(info.metadata.items()) if k != "tokenizer.chat_template"}
    out["general.parameter_count"] = sum(_count(t.shape) for t in info.tensors.values())
    return out


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _template(spec: ModelSpec, info=None) -> str:
    if spec.template is not None:
        return spec.template
    return (info or read_gguf(spec.target)).chat_template or ""


def draft_block(spec: ModelSpec, loaded) -> dict:
    """localspec's own: the drafter, its variant, and the draft sources a request may use."""
    drafter, source = None, "eagle"
    if spec.drafter is not None and Path(spec.drafter).is_file():
        d = read_gguf(spec.drafter)
        if d.is_assistant:   # Gemma 4's assistant: its architecture for a variant, source assistant
            source = "assistant"
        if d.is_block_drafter:   # DFlash / DSpark: the kind is the source and the variant
            source = d.block_kind
        drafter = {"file": Path(spec.drafter).name, "variant": d.arch if d.is_assistant else d.variant or "eagle3",
                   "target_layers": list(d.target_layers or ()), "draft_vocab": d.draft_vocab}
    sources = ([source] if drafter else []) + ["lookup"]
    block = {"drafter": drafter, "sources": sources, "parameters": dict(spec.draft_params)}
    if loaded is not None:
        p = loaded.defaults.policy
        block["policy"] = {"name": p.name, "draft_max": p.draft_max, "p_min": p.p_min, "tree": p.tree,
                           "source": p.source, "enabled": loaded.defaults.spec}
    return block


def show(manager: ModelManager, name: str, verbose: bool) -> dict:
    key = manager.canonical(name)
    spec = manager.spec(key)
    record = registry.load(key)
    mf = record.to_modelfile() if record is not None else mfmod.Modelfile(
        from_=str(spec.target), draft=str(spec.drafter) if spec.drafter else None,
        parameters={**spec.parameters, **spec.draft_params}, template=spec.template, system=spec.system,
        messages=list(spec.messages), license=list(spec.license))
    params = {**spec.parameters, **spec.draft_params}
    lines = [f"{k:<24}{json.dumps(v) if isinstance(v, str) else v}" for k, v in params.items() if k != "stop"]
    lines += [f"{'stop':<24}{json.dumps(s)}" for s in params.get("stop", [])]
    loaded = manager.loaded.get(key)
    info = loaded.engine.target_info if loaded is not None and loaded.spec.target == spec.target else None
    template = _template(spec, info)
    capabilities = ["completion"] + (["tools"] if template and detect_format(template).native else [])
    out = {"license": "\n".join(spec.license), "modelfile": mfmod.dumps(mf, header=f"Modelfile for {key}"),
           "parameters": "\n".join(lines), "template": template, "details": details(spec, info),
           "model_info": model_info(spec, verbose, info), "capabilities": capabilities,
           "modified_at": _modified(key, spec), "draft": draft_block(spec, manager.loaded.get(key))}
    if spec.system:
        out["system"] = spec.system
    if spec.messages:
        out["messages"] = [{"role": r, "content": c} for r, c in spec.messages]
    return out


def ps(manager: ModelManager) -> dict:
    models = []
    for m in list(manager.loaded.values()):
        expires = m.expires_at()
        when = datetime.fromtimestamp(expires, timezone.utc) if expires is not None else \
            datetime(2318, 1, 1, tzinfo=timezone.utc)   # "never", as Ollama writes keep_alive -1
        models.append({"name": f"{m.name}:latest", "model": f"{m.name}:latest", "size": m.memory_bytes,
                       "digest": digest(m.spec), "details": details(m.spec, m.engine.target_info),
                       "expires_at": when.isoformat(),
                       "size_vram": m.gpu_bytes, "context_length": m.engine.n_ctx,
                       "memory": {"devices": dict(m.device_bytes), "load_seconds": round(m.load_seconds, 3)}})
    return {"models": models}


# -- changing the store --------------------------------------------------------------------------------
def bare(name: Optional[str], field: str = "model") -> str:
    if not name:
        raise bad_request(f"{field} is required.", param=field)
    name = without_latest(name)
    if not is_model_name(name):
        raise bad_request(f"invalid model name '{shown(name)}' ({RULE}; the tag, if any, must be :latest).",
                          param=field)
    return name


def _blocking(call, *args):
    return asyncio.get_running_loop().run_in_executor(None, call, *args)


def _store_error(exc: LocalspecError, status: int = 400) -> APIError:
    return APIError(404 if isinstance(exc, NotFound) else status, str(exc))


def _message_role(i: int, role: str) -> str:
    """A stored message's role: those a Modelfile's MESSAGE takes (a tool result needs its call)."""
    if role not in mfmod.ROLES:
        raise bad_request(f"messages.{i}.role '{role}' cannot be stored with a model: a Modelfile's MESSAGE "
                          f"is one of {', '.join(mfmod.ROLES)}.", param=f"messages.{i}.role")
    return role


def create_modelfile(req: CreateRequest) -> mfmod.Modelfile:
    """The Modelfile ``/api/create`` describes (``modelfile``: an older client's text, under the fields)."""
    for field in ("quantize", "files", "adapters", "path"):
        if getattr(req, field):
            raise bad_request(f"{field} is not supported by this server (give from: a model name or a GGUF path).",
                              param=field)
    try:
        mf = mfmod.parse(req.modelfile, path="/api/create") if req.modelfile else mfmod.Modelfile(from_="")
    except LocalspecError as exc:
        raise bad_request(str(exc), param="modelfile") from None
    if req.from_:
        mf.from_ = req.from_[: -len(":latest")] if req.from_.endswith(":latest") else req.from_
    if not mf.from_:
        raise bad_request("from is required (a model name or a GGUF path).", param="from")
    if req.draft:
        mf.draft = req.draft
    for key, value in (req.parameters or {}).items():
        try:
            if key == "stop":
                mf.parameters["stop"] = [mfmod.check_parameter(key, v) for v in ([value] if isinstance(value, str) else value)]
            else:
                mf.parameters[key.lower()] = mfmod.check_parameter(key, value)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param=f"parameters.{key}") from None
    mf.template = req.template if req.template is not None else mf.template
    mf.system = req.system if req.system is not None else mf.system
    if req.messages:
        mf.messages = [(_message_role(i, m.role), m.content or "") for i, m in enumerate(req.messages)]
    if req.license:
        mf.license = [req.license] if isinstance(req.license, str) else list(req.license)
    return mf


def _copy(manager: ModelManager, source: str, destination: str) -> None:
    from ...store.locks import name_lock

    spec = manager.spec(manager.canonical(source))
    registry.check_name(destination)
    record = registry.load(source)
    with name_lock(destination, what="create", wait=True):
        if record is not None:
            copy = record.model_copy(update={"name": destination, "owned": [], "origin": {"copy": source}})
        else:
            copy = registry.UserModel(name=destination, target=str(Path(spec.target).absolute()),
                                      drafter=str(Path(spec.drafter).absolute()) if spec.drafter else None,
                                      parameters={**spec.parameters, **spec.draft_params}, template=spec.template,
                                      system=spec.system, messages=list(spec.messages), license=list(spec.license),
                                      origin={"copy": source})
        registry.save(copy)


def _pull_progress(name: str, record) -> list[dict]:
    files = [p for p in (record.target, record.drafter) if p] if record is not None else []
    out = [{"status": "pulling manifest"}]
    for f in files:
        size = Path(f).stat().st_size
        out.append({"status": f"pulling {Path(f).name}", "digest": f"sha256:{hashlib.sha256(f.encode()).hexdigest()}",
                    "total": size, "completed": size})
    out += [{"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]
    return out


async def _pull(manager: ModelManager, req: PullRequest) -> Response:
    from ...store.install import pull

    name = bare(req.target())
    if req.stream:
        async def lines():
            yield ndjson({"status": "pulling manifest"})
            try:
                record = await _blocking(pull, name)
            except LocalspecError as exc:
                yield ndjson({"error": str(exc)})
                return
            for obj in _pull_progress(name, record)[1:]:
                yield ndjson(obj)
        return ndjson_stream(lines())
    try:
        await _blocking(pull, name)
    except LocalspecError as exc:
        raise _store_error(exc) from None
    return JSONResponse({"status": "success"})


async def _create(manager: ModelManager, req: CreateRequest) -> Response:
    from ...store.install import create

    name = bare(req.model or req.name)
    mf = create_modelfile(req)   # a loaded model of this name is read again by its next request
    steps = [{"status": "reading model metadata"}, {"status": "creating model layer"}]
    if not req.stream:
        try:
            await _blocking(create, name, mf)
        except LocalspecError as exc:
            raise _store_error(exc) from None
        return JSONResponse({"status": "success"})

    async def lines():
        for obj in steps:
            yield ndjson(obj)
        try:
            await _blocking(create, name, mf)
        except LocalspecError as exc:
            yield ndjson({"error": str(exc)})
            return
        yield ndjson({"status": "writing manifest"})
        yield ndjson({"status": "success"})
    return ndjson_stream(lines())


def add_routes(app: FastAPI, state) -> None:
    manager: ModelManager = state.models

    @app.get("/")
    @app.head("/")
    async def root():
        return PlainTextResponse("Ollama is running")   # what Ollama's clients look for

    @app.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION, "localspec": __version__}

    @app.get("/api/tags")
    async def tags(request: Request):
        check_key(state.api_key, request)
        models = []
        for name in store_names():
            try:
                models.append(entry(name, manager.spec(name)))
            except (ModelError, LocalspecError):
                continue   # a damaged record or a missing file: not servable
        return {"models": models}

    @app.post("/api/show")
    async def show_route(request: Request):
        check_key(state.api_key, request)
        req = await read(state, request, ModelRequest)
        try:
            return show(manager, req.target() or "", req.verbose)
        except LocalspecError as exc:
            raise _store_error(exc) from None

    @app.get("/api/ps")
    async def ps_route(request: Request):
        check_key(state.api_key, request)
        return ps(manager)

    @app.post("/api/pull")
    async def pull_route(request: Request):
        check_key(state.api_key, request)
        return await _pull(manager, await read(state, request, PullRequest))

    @app.post("/api/create")
    async def create_route(request: Request):
        check_key(state.api_key, request)
        return await _create(manager, await read(state, request, CreateRequest))

    @app.post("/api/copy")
    async def copy_route(request: Request):
        check_key(state.api_key, request)
        req = await read(state, request, CopyRequest)
        source, destination = bare(req.source, "source"), bare(req.destination, "destination")
        try:
            await _blocking(_copy, manager, source, destination)
        except LocalspecError as exc:
            raise _store_error(exc) from None
        return Response(status_code=200)

    @app.delete("/api/delete")
    async def delete_route(request: Request):
        check_key(state.api_key, request)
        req = await read(state, request, ModelRequest)
        name = bare(req.target())
        if registry.load(name) is None:
            raise unknown(name)
        try:
            await _blocking(registry.remove, name)
        except LocalspecError as exc:
            raise _store_error(exc) from None
        manager.retire(name)   # loaded: it serves its running requests, then unloads
        return Response(status_code=200)
