"""``localspec chat``: the terminal chat (Textual). ``--list`` prints the saved conversations."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ..core.errors import LocalspecError
from ..core.options import DEFAULT_CTX
from .app import app
from .common import DraftOpt, ModelArg, TargetOpt, VerboseOpt, VramOpt
from .flags import check_flags, is_default, with_options

# the declared options (localspec.core.options) `chat` takes, with the chat's defaults
CHAT_OPTIONS = ("max_tokens", "temperature", "repeat_penalty", "repeat_last_n", "presence_penalty",
                "frequency_penalty", "rows_match", "n_ctx", "threads", "gpu_layers")


def _parse_resume(value: str, store) -> int:
    if value == "last":
        latest = store.latest_id()
        if latest is None:
            raise LocalspecError("there is no saved conversation to resume")
        return latest
    try:
        conversation_id = int(value.lstrip("#"))
    except ValueError:
        raise LocalspecError(f"--resume takes a conversation id or 'last', not '{value}'") from None
    if not 0 <= conversation_id < 2**63:   # an SQLite integer
        raise LocalspecError(f"no conversation with id {conversation_id} (localspec chat --list shows them)")
    if not store.exists(conversation_id):
        raise LocalspecError(f"no conversation with id {conversation_id} (localspec chat --list shows them)")
    return conversation_id


def _print_list(store) -> None:
    items = store.list(limit=1000)
    if not items:
        print(f"No saved conversations ({store.path}).")
        return
    print(f"{'ID':>5}  {'UPDATED':<16}  {'MSGS':>4}  {'MODEL':<16}  TITLE")
    for c in items:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
        print(f"{c.id:>5}  {when:<16}  {c.n_messages:>4}  {c.model[:16]:<16}  {c.title}")


def chat_settings(model_spec, *, system: Optional[str], given: dict, is_default) -> tuple:
    """The chat's starting settings, context size and threads: the model's PARAMETERs (Modelfile)
    fill in whatever the command line left at its default, as for ``generate``."""
    from dataclasses import fields

    from ..store.models import apply_model_defaults
    from ..tui.app import ChatSettings

    base = ChatSettings()
    options = {f.name: getattr(base, f.name) for f in fields(ChatSettings) if f.name != "system"}
    options.update(given)
    values = apply_model_defaults(model_spec, options, lambda name: name not in given or is_default(name))
    ctx = values.pop("ctx")
    threads = values.pop("threads")
    values["stop"] = tuple(values["stop"])
    settings = ChatSettings(system=system if system is not None else (model_spec.system or ""), **values)
    settings.config(True)  # validate before the UI starts
    return settings, ctx, threads


def engine_factory(model_spec, *, ctx: int = DEFAULT_CTX, threads: Optional[int] = None, gpu_layers: Optional[int] = None,
                   vram: Optional[str] = None, ram: Optional[str] = None,
                   verbose: bool = False):
    """What the app calls in its loading worker to build the engine for ``model_spec`` (a ModelSpec)."""
    from ..runtime.engine import Engine
    from ..runtime.loading import load_engine

    def build() -> Engine:
        # runs in the app's worker thread, so it prints nothing: a smaller context than asked for
        # comes back as engine.memory_plan.context_note and the app shows it
        return load_engine(model_spec, n_ctx=ctx, n_threads=threads, gpu_layers=gpu_layers, vram=vram, ram=ram,
                           verbose=verbose)

    return build


@app.command()
@with_options(*CHAT_OPTIONS, chat=True,
              max_tokens=dict(help="Most tokens per reply."),
              temperature=dict(help="0: greedy (the other sampling defaults are llama.cpp's and Ollama's)."),
              threads=dict(help="CPU threads (default: all available cores but one, left to the UI)."))
def chat(
    cli: typer.Context,
    model: Optional[str] = ModelArg,
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt (editable in the app, F2).",
                                         show_default=False),
    resume: Optional[str] = typer.Option(None, "--resume", help="Resume a saved conversation: its id, or 'last'.",
                                         show_default=False),
    list_: bool = typer.Option(False, "--list", help="List the saved conversations and exit."),
    no_spec: bool = typer.Option(False, "--no-spec", help="Start with speculation off (Ctrl+T toggles it)."),
    vram: Optional[str] = VramOpt,
    verbose: bool = VerboseOpt,
    **flags,
) -> None:
    """Chat in the terminal. Conversations are saved as they happen; --list shows them.
    A model's Modelfile PARAMETERs are the defaults; the flags here override them."""
    from ..store.conversations import ConversationStore

    if list_:   # read only: a chat writing meanwhile does not make it wait
        with ConversationStore(read_only=True) as store:
            _print_list(store)
        return
    store = ConversationStore()
    try:
        resume_id = _parse_resume(resume, store) if resume is not None else None
        from ..store.models import resolve

        from ..core.options import check_text, threads_warning

        check_flags(flags)
        if system is not None:
            check_text("the system prompt", system)
        model_spec = resolve(model, target=target, draft=draft)
        for label, path in (("target", model_spec.target), ("drafter", model_spec.drafter)):
            if path is not None and not Path(path).is_file():
                raise LocalspecError(f"the {label} file {path} does not exist")
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise LocalspecError("chat needs an interactive terminal (use `localspec generate` in scripts)")

        from ..tui.app import ChatApp

        gpu_layers = flags.pop("gpu_layers")   # the engine's, not a chat setting
        settings, ctx, threads = chat_settings(model_spec, system=system, given=flags, is_default=is_default(cli))

        from ..formats.gguf_info import read_gguf
        from ..llama.llama_model import check_threads, default_threads
        from ..core.options import check_n_ctx

        check_n_ctx(ctx, read_gguf(model_spec.target).n_ctx_train, model=Path(model_spec.target).name)  # before the UI

        if threads:
            check_threads(threads)   # before the UI starts, not in it
            warning = threads_warning(threads)
            if warning:
                print(warning, file=sys.stderr)
        else:
            # the UI renders the reply on a core of its own: with llama.cpp on every core, its spinning
            # workers and the UI preempt each other (docs/speculation.md, "Threads under load")
            threads = default_threads(reserve=1)
        factory = engine_factory(model_spec, ctx=ctx, threads=threads, gpu_layers=gpu_layers, vram=vram, verbose=verbose)
        chat_app = ChatApp(factory, model_name=model_spec.name, store=store, settings=settings, resume=resume_id)
        chat_app.spec_enabled = not no_spec
        chat_app.run()
    finally:
        store.close()
