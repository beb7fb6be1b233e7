"""``localspec serve``: the OpenAI-compatible HTTP server (see :mod:`localspec.server`)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Optional

import typer

from ..core.errors import LocalspecError
from ..store.models import apply_model_defaults, resolve
from .app import app
from .common import DraftOpt, ModelArg, TargetOpt, VerboseOpt, VramOpt
from .flags import check_flags, is_default, with_options
from .spec_options import NoSpecOpt, SPEC_OPTIONS

API_KEY_ENV = "LOCALSPEC_API_KEY"
# a stream's later text waits up to this long to join the next tokens in one chunk: every chunk
# costs the event loop ~0.25 ms of Python on the cores llama.cpp needs (docs/server.md)
STREAM_INTERVAL_MS = 40


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port), or one Error line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise LocalspecError(f"cannot resolve --host {host}: {exc.strerror}") from None
    except (UnicodeError, ValueError) as exc:   # the IDNA codec refuses the name (an empty label: 'ex..ample')
        raise LocalspecError(f"--host {host!r} is not a valid host name ({exc})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise LocalspecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def checked_api_key(api_key: Optional[str], where: str) -> Optional[str]:
    """The key a client must send, or None for none. An empty key is refused (an empty Bearer
    token must never count as knowing it); so is one an HTTP header cannot carry as sent: only
    visible ASCII characters (a byte that is not UTF-8 made every request fail with 500)."""
    if api_key is None:
        return None
    if api_key == "":
        raise LocalspecError(f"{where} is empty: give a key, or leave it out to serve without one")
    if not all(33 <= ord(c) <= 126 for c in api_key):
        raise LocalspecError(f"{where} must be visible ASCII characters (no spaces, no other bytes): "
                             "an HTTP Authorization header carries it")
    return api_key


def is_loopback(sock: socket.socket) -> bool:
    """Whether ``sock`` listens on a loopback address only (not 0.0.0.0, ::, or an interface's address)."""
    host = sock.getsockname()[0]
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def announce(sock: socket.socket, what: str, *, api_key: Optional[str]) -> None:
    """The start-up lines: what is served (stderr), a warning when anyone could use it, the URL."""
    url = url_of(sock)
    print(f"localspec serve: {what}", file=sys.stderr)
    if api_key is None and not is_loopback(sock):
        print(f"Warning: {url} is reachable from other machines and no API key is set: anyone who can reach it "
              f"can use this server (set --api-key or ${API_KEY_ENV}).", file=sys.stderr)
    print(f"Listening on {url}  (OpenAI base_url: {url}/v1; Ctrl+C stops)", flush=True)


def drafting(engine, model_spec, no_spec: bool) -> str:
    if no_spec:
        return "speculation off"
    if engine.spec_note is not None:   # a recurrent state llama.cpp cannot roll back (runtime.recurrent)
        return "speculation off: its recurrent state cannot be rolled back"
    if engine.drafter is None:
        return "no drafter: n-gram lookup drafts only"
    if engine.mtp_heads:
        return f"its own MTP heads ({engine.mtp_heads})"
    return f"drafter {model_spec.drafter.name}"


def slots(engine) -> str:
    n = engine.n_slots
    return f"context {engine.n_ctx}" if n == 1 else f"{n} slots of context {engine.n_ctx}"


@app.command()
@with_options("max_tokens", *SPEC_OPTIONS, "rows_match", "n_ctx", "threads", "gpu_layers", "parallel", "cache_ram",
              "kv_layout", max_tokens=dict(default=None, help="Default max_tokens of a request (default: up to the context's end)."),
              parallel=dict(default=None, help="Requests decoded together, each in its own slot of --ctx (default: "
                                               "4 if they fit the memory budget, else fewer)."))
def serve(
    cli: typer.Context,
    model: Optional[str] = ModelArg,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="Port to listen on (0: any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", show_default=False,
                                          help=f"Require 'Authorization: Bearer KEY' on /v1 and /api (or ${API_KEY_ENV})."),
    queue_size: int = typer.Option(16, "--queue-size", help="Requests that may wait for a free slot; more get 429."),
    max_body: str = typer.Option("4M", "--max-body", help="Largest request body (e.g. 512K, 4M); larger get 413."),
    stream_interval_ms: int = typer.Option(STREAM_INTERVAL_MS, "--stream-interval-ms",
                                           help="How long a stream's text may wait to join the next tokens in one "
                                                "chunk (0: a chunk every step; first tokens and ends never wait)."),
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    no_spec: bool = NoSpecOpt,
    vram: Optional[str] = VramOpt,
    ram: Optional[str] = typer.Option(None, "--ram", show_default=False,
                                      help="System RAM budget of the memory plan (default: available RAM)."),
    max_loaded: Optional[int] = typer.Option(None, "--max-loaded", show_default=False,
                                             help="Most models loaded at once (default: as many as the memory "
                                                  "budget holds)."),
    keep_alive: str = typer.Option("5m", "--keep-alive",
                                   help="How long a model a request loaded stays loaded after its last request "
                                        "(Ollama's keep_alive: 5m, 1h, seconds, 0, -1: keep)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No request log (one line per request on stderr)."),
    expose_paths: bool = typer.Option(False, "--expose-paths",
                                      help="Show the model files' paths in /v1/models (default: their names)."),
    verbose: bool = VerboseOpt,
    **flags,
) -> None:
    """Serve MODEL over HTTP with OpenAI's API (/v1/chat/completions, /v1/responses, /v1/completions,
    /v1/models) and Ollama's (/api/chat, /api/generate, /api/tags...), /health and Prometheus /metrics.
    A request naming another model in the store loads it (within the memory budget). Up to --parallel
    requests per model run at once, decoded in one batch; the others wait in arrival order."""
    from ..core.units import parse_size

    resolved = _resolved(model, target, draft)
    api_key = _given_api_key(api_key)
    keep_seconds = _checked_args(port, queue_size, max_loaded, keep_alive, stream_interval_ms)
    check_flags(flags)
    body_limit = parse_size(max_body)
    if body_limit < 1024:
        raise LocalspecError("--max-body must be at least 1K")
    max_tokens, gpu_layers, parallel = flags.pop("max_tokens"), flags.pop("gpu_layers"), flags.pop("parallel")
    cache_ram, kv_layout = flags.pop("cache_ram"), flags.pop("kv_layout")
    settings = _model_settings(flags, is_default(cli), max_tokens=max_tokens, no_spec=no_spec)
    settings(resolved)
    sock = bind(host, port)
    state = _serve_state(resolved, settings, queue_size=queue_size, cache_ram=cache_ram, gpu_layers=gpu_layers,
                         parallel=parallel, verbose=verbose, max_loaded=max_loaded, ram=ram, vram=vram,
                         keep_alive=keep_seconds, kv_layout=kv_layout, api_key=api_key, max_body=body_limit,
                         expose_paths=expose_paths, log_requests=not quiet,
                         stream_interval=stream_interval_ms / 1000)
    from ..server.app import create_app
    from ..server.run import run

    primary = state.models.loaded[resolved.name]
    engine = primary.engine
    server_app = create_app(state)
    announce(sock, f"{resolved.name} ({drafting(engine, resolved, no_spec)}), {slots(engine)}, "
                   f"queue {queue_size}{', API key required' if api_key else ''}", api_key=api_key)
    stopped_by = run(server_app, sock, verbose=verbose, on_shutdown=state.models.abort, on_exit=state.close)
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt   # "Interrupted.", exit 130
    if stopped_by == signal.SIGTERM:
        raise typer.Exit(128 + signal.SIGTERM)   # 143, as a shell reports a process ended by SIGTERM


def _model_settings(flags: dict, given, *, max_tokens: Optional[int], no_spec: bool):
    """spec -> a model's context, threads and request defaults: the flags given, else its PARAMETERs."""
    def settings(spec):
        values = apply_model_defaults(spec, flags, given)   # PARAMETERs are checked when parsed
        ctx, threads, rows_match = values.pop("ctx"), values.pop("threads"), values.pop("rows_match")
        from ..runtime.engine import GenerationConfig
        from ..runtime.generation_options import GenerationOptions
        from ..server.params import ServeDefaults

        policy_config = GenerationOptions.from_values(values).policy_config()
        GenerationConfig(policy=policy_config)   # the speculation flags are checked before the model loads
        return ctx, threads, ServeDefaults.for_model(spec, n_ctx=ctx, max_tokens=max_tokens,
                                                     spec_enabled=not no_spec, policy=policy_config,
                                                     rows_match=rows_match)
    return settings


def _given_api_key(api_key: Optional[str]) -> Optional[str]:
    """--api-key, else $LOCALSPEC_API_KEY (an empty variable counts as unset, and the warning says
    so when the server is reachable), checked."""
    if api_key is not None:
        return checked_api_key(api_key, "--api-key")
    return checked_api_key(os.environ.get(API_KEY_ENV) or None, f"${API_KEY_ENV}")


def _resolved(model: Optional[str], target: Optional[Path], draft: Optional[Path]):
    resolved = resolve(model, target=target, draft=draft)
    for label, path in (("target", resolved.target), ("drafter", resolved.drafter)):
        if path is not None and not Path(path).is_file():
            raise LocalspecError(f"the {label} file {path} does not exist")
    return resolved


def _checked_args(port: int, queue_size: int, max_loaded: Optional[int], keep_alive: str,
                  stream_interval_ms: int = STREAM_INTERVAL_MS) -> Optional[float]:
    """--keep-alive in seconds (None: keep), or one Error line for any value out of range."""
    from ..server.models_manager import parse_keep_alive

    if not 1 <= port <= 65535 and port != 0:
        raise LocalspecError(f"--port must be between 0 and 65535, got {port}")
    if queue_size < 1:
        raise LocalspecError("--queue-size must be at least 1")
    if max_loaded is not None and max_loaded < 1:
        raise LocalspecError("--max-loaded must be at least 1")
    if not 0 <= stream_interval_ms <= 1000:
        raise LocalspecError(f"--stream-interval-ms must be 0 to 1000, got {stream_interval_ms}")
    try:
        keep_seconds = parse_keep_alive(keep_alive)
    except ValueError:
        raise LocalspecError(f"--keep-alive must be a duration (5m, 1h), seconds, 0 or -1, got '{keep_alive}'") from None
    return keep_seconds


def _serve_state(resolved, settings, *, queue_size, cache_ram, gpu_layers, parallel, verbose, max_loaded, ram, vram,
                 keep_alive, kv_layout, api_key, max_body, expose_paths, log_requests, stream_interval=0.0):
    """The server's state with MODEL loaded (kept loaded until a request says otherwise or it is
    evicted); the other models in the store load on demand."""
    from ..core.options import check_cli, threads_warning
    from ..core.units import parse_size
    from ..memory.probe import device_budgets
    from ..server.app import ServerState
    from ..server.models_manager import ModelManager, Settings

    ctx, threads, _ = settings(resolved)
    check_cli(dict(n_ctx=ctx, threads=threads, gpu_layers=gpu_layers))   # before any file or llama.cpp
    warning = threads_warning(threads)
    if warning:
        print(warning, file=sys.stderr)
    ram_b = parse_size(ram) if ram is not None else None
    vram_b = parse_size(vram) if vram is not None else None
    config = Settings(settings, queue_size=queue_size, cache_bytes=cache_ram << 20, gpu_layers=gpu_layers,
                      parallel=parallel, verbose=verbose, max_loaded=max_loaded, ram=ram_b, vram=vram_b,
                      keep_alive=keep_alive, kv_layout=kv_layout, stream_interval=stream_interval)
    manager = ModelManager(config, device_budgets(vram_b, ram_b), default=resolved)
    manager.load_now(resolved)   # a plan that does not fit: one Error line
    return ServerState(manager, api_key=api_key, max_body=max_body, expose_paths=expose_paths,
                       log_requests=log_requests)
