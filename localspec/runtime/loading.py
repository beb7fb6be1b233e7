"""The one way from a model to an engine: the memory plan for it (:func:`localspec.memory.pair.plan_engine`),
then the :class:`~localspec.runtime.engine.Engine` that plan sizes. ``localspec generate``/``bench``/``serve``'s
commands (``cli/common.open_engine``), the chat's loading worker (``cli/chat.engine_factory``) and the
server's model manager all open their engines here, so the same model gets the same engine everywhere.
Nothing here prints: what a caller shows of the plan (a smaller context) it shows from ``on_plan``."""

from __future__ import annotations

from typing import Callable

from ..core.errors import LocalspecError
from ..core.options import listed_words
from ..formats.gguf_info import read_gguf
from ..memory.pair import plan_engine
from .engine import Engine


def load_engine(spec, *, n_ctx: int, n_threads: int | None = None, gpu_layers: int | None = None,
                vram: str | int | None = None, ram: str | int | None = None, parallel: int | None = 1,
                kv_type: str | None = None, source=None, verbose: bool = False, rows_match: bool = False,
                kv_layout: str = "auto", on_plan: Callable[[object], None] | None = None) -> Engine:
    """The engine for ``spec`` (a :class:`~localspec.store.models.ModelSpec`: its target, drafter and
    chat template), sized by its memory plan (see ``plan_engine`` for ``n_ctx``, ``gpu_layers``,
    ``vram``, ``ram``, ``parallel`` and ``kv_type``). ``on_plan(plan)`` runs before anything is
    loaded (it may refuse by raising). ``source`` (the ``--source`` words): ``mtp`` asks for the
    target's MTP heads (else they draft whenever no drafter file is given); ``assistant`` needs the
    drafter file to be a Gemma 4 assistant, ``dflash``/``dspark`` a block drafter of that kind, said
    before loading. ``kv_layout``: the target's KV with several slots (:func:`~localspec.runtime.kv_layout.choose`)."""
    options = plan_engine(spec, n_ctx=n_ctx, n_threads=n_threads, gpu_layers=gpu_layers, vram=vram,
                          parallel=parallel, ram=ram, kv_type=kv_type)
    words = listed_words(getattr(source, "value", source)) if source is not None else ()
    if "assistant" in words:   # after the plan: the files were read and checked
        _check_assistant(spec)
    for word in {"dflash", "dspark"} & set(words):
        _check_block_drafter(spec, word)
    if on_plan is not None:
        on_plan(options["memory_plan"])
    return Engine(spec.target, spec.drafter, n_threads=n_threads, verbose=verbose, chat_template=spec.template,
                  mtp=True if "mtp" in words else None, rows_match=rows_match, kv_layout=kv_layout, **options)


def _check_assistant(spec) -> None:
    """``--source assistant``: the model's drafter file is a Gemma 4 assistant."""
    if spec.drafter is None or not read_gguf(spec.drafter).is_assistant:
        raise LocalspecError("source assistant: this model has no Gemma 4 assistant (give its GGUF as the "
                             "drafter: --draft, or DRAFT in a Modelfile)")


def _check_block_drafter(spec, word: str) -> None:
    """``--source dflash`` / ``dspark``: the model's drafter file is a block drafter of that kind."""
    if spec.drafter is None or read_gguf(spec.drafter).block_kind != word:
        raise LocalspecError(f"source {word}: this engine has no {word} block drafter (give its GGUF as the "
                             "drafter: --draft, or DRAFT in a Modelfile)")
