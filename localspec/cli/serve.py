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
from .common import DraftOpt, ModelArg, TargetOpt, VerboseOpt, VramOpt, open_engine
from .flags import check_flags, is_default, with_options
from .spec_options import NoSpecOpt, SPEC_OPTIONS

API_KEY_ENV = "LOCALSPEC_API_KEY"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port), or one Error line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise LocalspecError(f"cannot resolve --host {host}: {exc.strerror}") from None
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


def calibration_log(engine) -> None:
    """Calibrate in the background (requests never wait for it) and say so in the log."""
    from ..server.worker import log

    def changed(state: str) -> None:
        if state == "running" and engine.calibrator.runs > 1:
            return   # a retry after a pause: said once
        cost = engine.cost
        detail = (f" (V(1) {cost.verify(1) * 1e3:.2f} ms, V(8) {cost.verify(8) * 1e3:.2f} ms, cached)"
                  if state == "done" and cost is not None else "")
        log(engine.calibrator.describe() + detail)
    engine.calibrator.listeners.append(changed)
    engine.calibrate_in_background()
    if engine.calibrator.state == "cached":
        log(engine.calibrator.describe())


def drafting(engine, model_spec, no_spec: bool) -> str:
    if no_spec:
        return "speculation off"
    if engine.drafter is None:
        return "no drafter: n-gram lookup drafts only"
    return f"drafter {model_spec.drafter.name}"


def slots(engine) -> str:
    n = engine.n_slots
    return f"context {engine.n_ctx}" if n == 1 else f"{n} slots of context {engine.n_ctx}"


@app.command()
@with_options("max_tokens", *SPEC_OPTIONS, "n_ctx", "threads", "gpu_layers", "parallel", "cache_ram",
              max_tokens=dict(default=None, help="Default max_tokens of a request (default: up to the context's end)."),
              parallel=dict(default=None, help="Requests decoded together, each in its own slot of --ctx (default: "
                                               "4 if they fit the memory budget, else fewer)."))
def serve(
    cli: typer.Context,
    model: Optional[str] = ModelArg,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="Port to listen on (0: any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", show_default=False,
                                          help=f"Require 'Authorization: Bearer KEY' on /v1 (or ${API_KEY_ENV})."),
    queue_size: int = typer.Option(16, "--queue-size", help="Requests that may wait for a free slot; more get 429."),
    max_body: str = typer.Option("4M", "--max-body", help="Largest request body (e.g. 512K, 4M); larger get 413."),
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    no_spec: bool = NoSpecOpt,
    vram: Optional[str] = VramOpt,
    ram: Optional[str] = typer.Option(None, "--ram", show_default=False,
                                      help="System RAM budget of the memory plan (default: available RAM)."),
    verbose: bool = VerboseOpt,
    **flags,
) -> None:
    """Serve MODEL over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models),
    /health and Prometheus /metrics. Up to --parallel requests run at once, decoded in one batch;
    the others wait in arrival order."""
    from ..core.units import parse_size

    resolved = resolve(model, target=target, draft=draft)
    for label, path in (("target", resolved.target), ("drafter", resolved.drafter)):
        if path is not None and not Path(path).is_file():
            raise LocalspecError(f"the {label} file {path} does not exist")
    api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    if not 1 <= port <= 65535 and port != 0:
        raise LocalspecError(f"--port must be between 0 and 65535, got {port}")
    if queue_size < 1:
        raise LocalspecError("--queue-size must be at least 1")
    check_flags(flags)
    body_limit = parse_size(max_body)
    if body_limit < 1024:
        raise LocalspecError("--max-body must be at least 1K")
    max_tokens, gpu_layers, parallel = flags.pop("max_tokens"), flags.pop("gpu_layers"), flags.pop("parallel")
    cache_ram = flags.pop("cache_ram")
    values = apply_model_defaults(resolved, flags, is_default(cli))   # PARAMETERs are checked when parsed
    ctx, threads = values.pop("ctx"), values.pop("threads")
    from ..runtime.generation_options import GenerationOptions

    policy_config = GenerationOptions.from_values(values).policy_config()

    from ..runtime.engine import GenerationConfig
    from ..server.app import ServerState, create_app
    from ..server.metrics import ServerMetrics
    from ..server.params import ServeDefaults
    from ..server.worker import EngineWorker

    GenerationConfig(policy=policy_config)   # the speculation flags are checked before the model loads
    defaults = ServeDefaults.for_model(resolved, n_ctx=ctx, max_tokens=max_tokens, spec_enabled=not no_spec,
                                       policy=policy_config)
    sock = bind(host, port)
    model_spec, engine = open_engine(model, target, draft, ctx=ctx, threads=threads, gpu_layers=gpu_layers,
                                     verbose=verbose, vram=vram, model_spec=resolved, parallel=parallel,
                                     ram=ram)
    from ..server.run import run

    worker = EngineWorker(engine, lambda **live: ServerMetrics(model_spec.name, **live), queue_size=queue_size,
                          cache_bytes=cache_ram << 20)
    state = ServerState(worker, model_spec, defaults, api_key=api_key, max_body=body_limit)
    server_app = create_app(state, on_shutdown=engine.close)
    announce(sock, f"{model_spec.name} ({drafting(engine, model_spec, no_spec)}), {slots(engine)}, "
                   f"queue {queue_size}{', API key required' if api_key else ''}", api_key=api_key)
    if not no_spec:
        calibration_log(engine)
    stopped_by = run(server_app, sock, verbose=verbose, on_shutdown=worker.abort, on_exit=state.close)
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt   # "Interrupted.", exit 130
    if stopped_by == signal.SIGTERM:
        raise typer.Exit(128 + signal.SIGTERM)   # 143, as a shell reports a process ended by SIGTERM
