"""The engine: a target model, an optional model drafter (an EAGLE drafter file, a Gemma 4 assistant
file: :mod:`localspec.speculation.assistant`, or the target's own MTP heads:
:mod:`localspec.speculation.mtp`), and generation as a stream of events.

    engine = Engine("target.gguf", drafter="drafter.gguf")
    for event in engine.generate([Message("user", "Hi")], GenerationConfig(max_tokens=64)):
        if isinstance(event, TokenEvent):
            print(event.text, end="")

Each cycle: the policy picks a draft source and depth (or none) from the cost model and live
acceptance; draft a chain (EAGLE drafter, or n-gram lookup in the prompt and the text so far),
verify ``[last, d1..dk]`` in ONE target decode, accept the longest prefix the target agrees with
(greedy: argmax; sampling: rejection rule of :mod:`localspec.runtime.sampling`; repetition penalties
counted over each position's own context, earlier drafts included), trim the target KV cache to
the committed tokens, and record the committed positions' target features for the drafter (written
lazily, only before it drafts). With ``spec=False`` the same cycle runs with no drafts: plain decoding.

The parts: :mod:`.generation` (one request's state: its rows and events), :mod:`.drafting` (one draft over the
sources), :mod:`.verifier` (the target context, its KV bookkeeping, the prompt's, chains' and trees' rows read back),
:mod:`.text_stream` (UTF-8 and stop-string holdback, finish reasons), :mod:`.calibration` (the
cost model's measurements), :mod:`.margins` (bench's logit margins, an observer of a generation),
:mod:`.scheduler` (the one driver: generations, one per slot, decoded together in one batch per
step), :mod:`.prompt_cache` (the texts of slots that moved on, kept in memory for a repeat).
The engine loads the models once and keeps what outlives one generation (prompt cache, cost model,
learned acceptance, recalled text). Every generation runs through
:class:`~localspec.runtime.scheduler.Scheduler`: :meth:`Engine.generate` is a scheduler of one
slot (the first), :meth:`Engine.batch_generate` one of every slot (``parallel`` of them: up to that
many prompts at once, the rest waiting for a free slot), as is ``serve --parallel``
(:meth:`Engine.scheduler` makes one, handing it a :class:`~localspec.runtime.scheduler.SlotHost`:
what it may use of the engine, never the engine itself). One scheduler holds the engine at a
time: a second generation meanwhile is refused.
"""

from __future__ import annotations

import numbers
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..core import options
from ..core.errors import GrammarError, LocalspecError
from ..core.events import DoneEvent, Event
from ..llama.grammar import Grammar
from ..llama.contexts import DRAFTER_BATCH, KV_TYPES, PROMPT_BATCH, SPLIT_KV_CELLS, TILED_ROWS, target_context
from ..core.paths import user_dir
from ..formats.chat_format import ChatFormatter, Message
from ..formats.gguf_info import GGUFInfo, check_pair, check_target, read_gguf
from ..llama.llama_model import Context, Model
from ..llama.process import set_verbose
from ..llama.special_split import TooManyTokens
from ..speculation import cost_cache, costmodel, tree
from ..speculation.assistant import ASSISTANT, AssistantDrafter
from ..speculation.dflash import DFLASH, DSPARK, BlockDrafter
from ..speculation.eagle import EagleDrafter
from ..speculation.mtp import MTP, MtpDrafter, mtp_heads
from ..speculation.policy import DraftPolicy, Learned
from ..speculation.recall import Recall
from ..speculation.sources import wants, wants_text, words
from .calibration import calibrate
from .calibrator import Calibrator
from .config import GenerationConfig
from . import kv_layout as kv_layouts
from .generation import Generation
from .scheduler import Scheduler, SlotHost, drive
from .margins import MarginRecorder
from .recurrent import bounded_policy, cannot_draft_note
from .threads import adaptive as adaptive_threads
from .verifier import TargetVerifier


class PromptTooLong(LocalspecError):
    """A prompt with as many tokens as the context holds, or more (the server answers
    ``context_length_exceeded``)."""

    def __init__(self, n_prompt: int, n_ctx: int, *, special: bool = False, at_least: bool = False) -> None:
        has = f"{'at least ' if at_least else ''}{n_prompt} {'special ' if special else ''}tokens"
        super().__init__(f"the prompt has {has}, more than the context of {n_ctx} (n_ctx) allows; "
                         "shorten it or use a larger context")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


def is_tokens(prompt) -> bool:
    """Whether ``prompt`` is token ids (a non-empty list or tuple of integers), not text or messages."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], numbers.Integral)
            and not isinstance(prompt[0], bool))


class Engine:
    """Target + optional drafter, loaded once; :meth:`generate` may be called many times."""

    def __init__(
        self,
        target: str | Path,
        drafter: str | Path | None = None,
        *,
        n_ctx: int = options.DEFAULT_CTX,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        drafter_gpu_layers: int = 0,
        verbose: bool = False,
        kv_type: str | None = None,
        n_outputs_max: int = 0,
        memory_plan=None,
        chat_template: str | None = None,
        parallel: int = 1,
        mtp: bool | None = None,
        rows_match: bool = False,
        kv_layout: str = "auto",
    ) -> None:
        set_verbose(verbose)
        self.target_info: GGUFInfo = read_gguf(target)
        check_target(self.target_info)
        self.drafter_info: GGUFInfo | None = None
        if drafter is not None:
            self.drafter_info = read_gguf(drafter)
            check_pair(self.target_info, self.drafter_info)
        self.mtp_heads = self._mtp_heads(mtp)
        self._mtp_requested = bool(mtp)
        n_ctx = options.check_n_ctx(n_ctx, self.target_info.n_ctx_train, model=self.target_info.path.name)
        if n_threads is not None:
            n_threads = options.check_threads(n_threads)
        n_gpu_layers = options.check("gpu_layers", n_gpu_layers)
        drafter_gpu_layers = options.check("gpu_layers", drafter_gpu_layers)
        # slots: sequences decoded together (localspec.runtime.scheduler), each with n_ctx positions
        self.n_slots = options.check("parallel", parallel)
        # from a memory plan (localspec.memory): KV type, verify-sized logit rows, the plan itself (kept
        # for reports: localspec.memory.live reads it)
        self.memory_plan = memory_plan
        # the target's KV: one stream per slot, or one pool of every slot's cells (runtime.kv_layout)
        self.kv_layout = kv_layouts.choose(kv_layout, self.n_slots, shared_kv=bool(
            self.drafter_info and self.drafter_info.is_assistant))
        self._open(n_ctx, n_threads, n_gpu_layers, drafter_gpu_layers, kv_type, n_outputs_max)
        self.rows_match = rows_match
        self._match_rows(n_ctx)
        self.formatter = self._chat_formatter(chat_template)
        self._n_gpu_layers, self._kv_type, self._verbose = n_gpu_layers, kv_type, verbose
        self.cost: costmodel.CostModel | None = None  # verify/drafter costs: cached, measured or a guess
        self.learned = Learned()  # the auto policy's acceptance statistics, across generations
        self.tree_calibration = tree.Calibration()  # draft probability -> acceptance, for trees
        self.recall = Recall()  # the recent generations' text, a draft source for the next ones
        # what the target KV cache holds, one verifier per slot (sequence); the first one is the
        # sequence a generation alone (generate) uses
        self.verifiers = self._verifiers()
        self.verifier = self.verifiers[0]
        self._lock = threading.Lock()
        # calibrates while no generation holds the engine (runtime.calibrator); generations take the
        # engine through it
        self.calibrator = Calibrator(self._lock, self._measure_costs, self._install_cost, self._measured_cost)
        # fewer threads while other processes take cores
        self.threads = adaptive_threads(self.ctx.n_threads, n_threads, self._set_threads)

    def _set_threads(self, n: int) -> None:
        """The thread count of the target's and the drafter's contexts; the cost model follows
        (figures for ``n`` threads)."""
        self.ctx.set_threads(n)
        if self.drafter is not None:
            self.drafter.ctx.set_threads(n)
        if self.cost is not None:
            self.cost.rekey(cost_cache.with_threads(self.cost.key, n))

    def _match_rows(self, n_ctx: int) -> None:
        """Where an exact batch (``rows_match``: greedy text the same with and without drafts on a
        CPU, whatever the thread count or the other slots) decodes one row as two (runtime.batch):
        where the KV view may reach SPLIT_KV_CELLS (past its first 256 cells, less a draft's or a
        tree's transient cells; with several slots, anywhere). ``rows_match``: the default of the
        generations whose config leaves it unset (None)."""
        if self.ctx.rollback != 0:   # the filler is rolled back (a recurrent state: 1 row)
            first = 0 if self.n_slots > 1 else SPLIT_KV_CELLS // 2 - TILED_ROWS
            self.ctx.pad_single = range(first, n_ctx - 1)   # the filler needs the next position

    def _mtp_heads(self, mtp: bool | None) -> int:
        """The target's MTP heads this engine drafts with (:mod:`localspec.speculation.mtp`):
        ``mtp`` None: when it has some and no drafter file is given; True: they must be there."""
        heads = mtp_heads(self.target_info) if mtp is not False else 0
        if mtp and not heads:
            raise LocalspecError(f"{self.target_info.path.name} has no MTP heads ({self.target_info.arch}."
                                 "nextn_predict_layers and their nextn tensors): --source mtp needs a model that ships them")
        if mtp and self.drafter_info is not None:
            raise LocalspecError("the MTP heads and an EAGLE drafter draft one at a time: leave out the drafter "
                                 "(--draft) to draft with the MTP heads")
        return heads if self.drafter_info is None else 0

    def _open(self, n_ctx: int, n_threads: int | None, n_gpu_layers: int, drafter_gpu_layers: int,
              kv_type: str | None, n_outputs_max: int) -> None:
        """Load the target and its context, then the drafter and its context beside it."""
        if kv_type is not None and kv_type not in KV_TYPES:
            raise LocalspecError(f"unknown KV cache type '{kv_type}' ({', '.join(KV_TYPES)})")
        self.model = Model(self.target_info.path, n_gpu_layers=n_gpu_layers, load_mtp=self.mtp_heads > 0)
        self.model.pieces()   # every token's text now (a few ms), not one cold tokenizer call per new token
        if self.model.recurrent:   # a state per sequence (llama.contexts.target_context)
            self.kv_layout = "unified"
        # n_ctx cells per slot: in a stream of its own, or in one pool shared by every slot
        self.ctx = Context(self.model, n_ctx=n_ctx * self.n_slots, n_batch=PROMPT_BATCH, n_threads=n_threads,
                           kv_type=KV_TYPES[kv_type][0] if kv_type else None, n_outputs_max=n_outputs_max,
                           **target_context(self.drafter_info is not None or self.mtp_heads > 0, self.n_slots,
                                            recurrent=self.model.recurrent, streams=self.kv_layout == "streams"))
        self.drafter: EagleDrafter | None = None
        self.drafters: list[EagleDrafter] = []   # one per slot: the drafter's sequence of that number
        try:
            self._no_rollback()   # a recurrent state llama.cpp cannot roll back: no drafts (runtime.recurrent)
            if self.drafter_info is not None and self.drafter_info.is_assistant:   # Gemma 4's, over the target's cache
                self.drafter = AssistantDrafter(self.drafter_info, self.ctx, n_batch=DRAFTER_BATCH, n_threads=n_threads,
                                                n_gpu_layers=drafter_gpu_layers, slots=self.n_slots)
            elif self.drafter_info is not None and self.drafter_info.is_block_drafter:   # DFlash, DSpark
                self.drafter = BlockDrafter(self.drafter_info, self.ctx, n_ctx=n_ctx, n_threads=n_threads,
                                            n_gpu_layers=drafter_gpu_layers, slots=self.n_slots)
            elif self.drafter_info is not None:
                self.drafter = EagleDrafter(self.drafter_info, self.ctx, n_ctx=n_ctx, n_batch=DRAFTER_BATCH,
                                            n_threads=n_threads, n_gpu_layers=drafter_gpu_layers, slots=self.n_slots)
            elif self.mtp_heads:   # the target's own heads, in a context beside it
                self.drafter = MtpDrafter(self.ctx, self.mtp_heads, n_ctx=n_ctx, n_batch=DRAFTER_BATCH,
                                          n_threads=n_threads, slots=self.n_slots)
            if self.drafter is not None:
                self.drafters = [self.drafter.for_sequence(i) for i in range(self.n_slots)]
        except BaseException:
            self.close()
            raise

    def _no_rollback(self) -> None:
        """A target whose recurrent state llama.cpp cannot roll back decodes plainly: no drafter,
        no MTP heads, no lookup (:meth:`open_generation`), one note on stderr."""
        why = cannot_draft_note(self.model, self.ctx)
        self.spec_note = None if why is None else f"{why}, so it decodes plainly (no drafts)"
        if why is None:
            return
        if self._mtp_requested:
            raise LocalspecError(f"{why}: --source mtp cannot draft with its MTP heads")
        self.drafter_info, self.mtp_heads = None, 0
        print(f"note: {self.spec_note}", file=sys.stderr)

    def _verifiers(self) -> list[TargetVerifier]:
        """One verifier per slot, each with its share of the KV pool."""
        if self.n_slots > self.ctx.n_outputs_max:   # every slot's row of a step needs its logits
            self.close()
            raise LocalspecError(f"{self.n_slots} slots are more than the {self.ctx.n_outputs_max} logit rows "
                                 "one batch of this context holds (use a smaller --parallel)")
        per_slot = self.ctx.n_ctx // self.n_slots
        return [TargetVerifier(self.model, self.ctx, seq=i, n_ctx=per_slot) for i in range(self.n_slots)]

    def _chat_formatter(self, chat_template: str | None) -> ChatFormatter:
        """The target's chat template; a Modelfile's TEMPLATE (Jinja) replaces the one in the GGUF."""
        model = self.model
        return ChatFormatter(
            chat_template if chat_template is not None else self.target_info.chat_template,
            from_modelfile=chat_template is not None,
            bos_token=model.piece(model.bos).decode("utf-8", "replace") if model.bos >= 0 else "",
            eos_token=model.piece(model.eos).decode("utf-8", "replace") if model.eos >= 0 else "",
            name=("the Modelfile TEMPLATE" if chat_template is not None
                  else f"the chat template of {self.target_info.path.name}"),
        )

    # -- prompts ---------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        """Positions one request may fill (a slot's share of the KV pool)."""
        return self.verifier.n_ctx

    def prompt_tokens(self, prompt: str | Sequence[Message | dict], *, parse_special: bool = True) -> list[int]:
        """Tokens for a raw text prompt (str) or a chat (messages, rendered with the model's template).

        In a raw prompt, special-token text such as ``<|im_start|>`` becomes the special token, as
        llama.cpp's tools parse it; ``parse_special=False`` keeps it plain text."""
        try:   # a text with as many special tokens as the context holds: refused before it is tokenized
            if isinstance(prompt, str):
                options.check_text("the prompt", prompt)
                tokens = self.model.tokenize(prompt, add_special=True, parse_special=parse_special, limit=self.n_ctx)
            else:
                options.check_messages(prompt)
                text = self.formatter.render(prompt, add_generation_prompt=True)
                tokens = self.model.tokenize(text, add_special=True, parse_special=True, limit=self.n_ctx)
        except TooManyTokens as exc:
            raise PromptTooLong(exc.count, self.n_ctx, special=exc.special, at_least=True) from None
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.model.bos:
            tokens = tokens[1:]  # the template (or the raw prompt) wrote BOS itself
        return tokens

    def prepare(self, prompt: str | Sequence[Message | dict], *, parse_special: bool = True) -> list[int]:
        """The prompt's tokens, checked as :meth:`generate` needs them: the template rendered (a
        chat), the text tokenized, and the result neither empty nor too long for the context. Pass
        the tokens to :meth:`generate` to skip doing it again (the server prepares before it answers)."""
        return self._check_tokens(self.prompt_tokens(prompt, parse_special=parse_special))

    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        if not tokens:
            raise LocalspecError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise PromptTooLong(len(tokens), self.n_ctx)
        n_vocab = self.model.n_vocab
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and 0 <= t < n_vocab
                   for t in tokens):
            raise LocalspecError(f"prompt tokens must be token ids from 0 to {n_vocab - 1}")
        return [int(t) for t in tokens]

    # -- generation ------------------------------------------------------------------------------
    def scheduler(self, prompt_cache=None, *, slots: int | None = None, hold: bool = False) -> Scheduler:
        """A scheduler of this engine's slots (the first ``slots``; None: all) given only what it
        needs of the engine (:class:`~localspec.runtime.scheduler.SlotHost`); ``prompt_cache``
        and ``hold``: see :class:`~localspec.runtime.scheduler.Scheduler`."""
        drafter = self.drafter
        host = SlotHost(self.ctx, self.verifiers, self.drafters, self.open_generation, self._claim,
                        self.calibrator.release, self.threads.tick if self.threads.adapts else None,
                        self._record_batch,
                        drafter.decode_steps if drafter is not None else None,
                        drafter.catch_ups if drafter is not None else None,
                        drafter.greedy_rounds if drafter is not None else None,
                        drafter.catch_up_rounds if drafter is not None else None)
        return Scheduler(host, prompt_cache, slots=slots, hold=hold)

    def _claim(self) -> bool:
        """Take the engine for a generation (a background calibration stops for it), the thread
        count read as it starts; False: a generation holds it."""
        if not self.calibrator.acquire():
            return False
        self.threads.tick(start=True)
        return True

    def _record_batch(self, rows: int, seconds: float) -> None:
        """A batch of several slots, timed once: one observation for the cost model."""
        if self.cost is not None:
            self.cost.observe_verify(rows, seconds)

    def generate(
        self,
        prompt: str | Sequence[Message | dict] | Sequence[int],
        config: GenerationConfig | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Yield TokenEvents and CycleEvents as tokens are produced, then one DoneEvent. ``prompt``:
        raw text, chat messages, or token ids from :meth:`prepare`."""
        config = config or GenerationConfig()
        if is_tokens(prompt):
            tokens = self._check_tokens(prompt)
        else:
            tokens = self.prepare(prompt, parse_special=config.parse_special)
        yield from self._generate(tokens, config, cancel)

    def _generate(self, prompt: list[int], config: GenerationConfig, cancel: threading.Event | None) -> Iterator[Event]:
        """A scheduler of one slot (the first): admitted, stepped until done, each step's events
        yielded before the next step is decoded."""
        margins = MarginRecorder() if config.record_margins else None
        events: list[Event] = []
        scheduler = self.scheduler(slots=1, hold=True)
        scheduler.admit(prompt, config, cancel, events.append, observers=[margins] if margins is not None else ())
        for _, event in drive(scheduler, [(0, events)]):
            if margins is not None and isinstance(event, DoneEvent):
                event = replace(event, margins=margins.result(len(event.tokens)))
            yield event

    def batch_generate(
        self,
        prompts: Sequence[str | Sequence[Message | dict] | Sequence[int]],
        config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Iterator[tuple[int, Event]]:
        """Generate every prompt, up to :attr:`n_slots` at once in one decode per step (the rest
        wait for a free slot, in order): ``(i, event)`` pairs as they come, ``i`` the prompt's
        index; each prompt's events end with its DoneEvent. ``config``: one for all, or one per
        prompt. Every prompt is checked before anything runs."""
        configs = list(config) if isinstance(config, (list, tuple)) else [config] * len(prompts)
        if len(configs) != len(prompts):
            raise LocalspecError(f"{len(prompts)} prompts and {len(configs)} configs: give one config, or one per prompt")
        configs = [c or GenerationConfig() for c in configs]
        tokens = [self._check_tokens(p) if is_tokens(p) else self.prepare(p, parse_special=c.parse_special)
                  for p, c in zip(prompts, configs)]
        yield from self._batch(tokens, configs, cancel)

    def _batch(self, tokens: list[list[int]], configs: list[GenerationConfig],
               cancel: threading.Event | None) -> Iterator[tuple[int, Event]]:
        scheduler = self.scheduler(hold=True)
        queues: list[tuple[int, list[Event]]] = [(i, []) for i in range(len(tokens))]
        waiting = list(range(len(tokens)))

        def admit() -> None:   # the waiting prompts into the free slots, in order
            while waiting and scheduler.free:
                i = waiting.pop(0)
                scheduler.admit(tokens[i], configs[i], cancel, queues[i][1].append)

        admit()
        yield from drive(scheduler, queues, admit)

    def open_generation(self, verifier: TargetVerifier, prompt: list[int], config: GenerationConfig,
                        cancel: threading.Event | None, *, drafter=None, observers=()) -> Generation:
        """A generation of ``prompt`` on ``verifier``'s sequence, not started, for a scheduler's
        slot to drive; it drafts with ``drafter``, the slot's drafter sequence (None: the one of
        the verifier's number). Draft trees (their branches are sequences of their
        own) only in an engine of one slot, and not with chained MTP heads. It never waits for a
        calibration: without one, the policy plans with what :meth:`planning_cost` gives."""
        if self.spec_note is not None:   # a recurrent state that cannot be rolled back
            config = replace(config, spec=False)
        pcfg = bounded_policy(config.policy, self.ctx)   # a recurrent state: no deeper than it rolls back
        chained = self.drafter is not None and self.drafter.max_depth is not None
        if (self.n_slots > 1 or chained) and pcfg.tree != "off":
            pcfg = replace(pcfg, tree="off")
        if drafter is None and self.drafters:
            drafter = self.drafters[verifier.seq]
        if not (self.drafter is not None and config.spec and wants(pcfg.source, self.drafter.name)):
            drafter = None
        names = words(pcfg.source)
        if config.spec and MTP in names and not self.mtp_heads:
            raise LocalspecError("source mtp: this engine drafts with no MTP heads (open it with mtp=True, "
                                 "a target that ships them and no drafter file)")
        if config.spec and ASSISTANT in names and drafter is None:
            raise LocalspecError("source assistant: this engine has no Gemma 4 assistant (give its GGUF as the "
                                 "drafter: --draft, or DRAFT in a Modelfile)")
        for word in (DFLASH, DSPARK):
            if config.spec and word in names and drafter is None:
                raise LocalspecError(f"source {word}: this engine has no {word} block drafter (give its GGUF as "
                                     "the drafter: --draft, or DRAFT in a Modelfile)")
        exact = self.rows_match if config.rows_match is None else config.rows_match
        if exact:   # flash attention on a CPU tiles TILED_ROWS query rows or more otherwise
            pcfg = replace(pcfg, lookup_max=min(pcfg.lookup_max, TILED_ROWS - 2),
                           tree_nodes=min(pcfg.tree_nodes, TILED_ROWS - 2))
        use_lookup = config.spec and wants_text(pcfg.source)   # any text source (lookup, a registered one)
        wants_cost = pcfg.name == "auto" and (drafter is not None or use_lookup)
        model = self.planning_cost() if wants_cost else None
        self.learned.new_generation()
        policy = DraftPolicy(pcfg, model, model=drafter.name if drafter is not None else None, lookup=use_lookup,
                             learned=self.learned)
        policy.block = bool(getattr(drafter, "block", False))   # a block drafter: one decode per draft
        return Generation(verifier, prompt, config, policy, drafter, self.tree_calibration,
                          observers=observers, cancel=cancel,
                          recall=self.recall if pcfg.recall else None,   # off: neither drafts from it nor adds to it
                          exact=exact)

    def prediction_tokens(self, prediction: str) -> tuple:
        """Predicted Outputs' tokens for a generation's ``prediction_tokens`` (a server tokenizes
        them off the engine thread); a prediction longer than the context is refused (an answer
        never holds more tokens than that, and its index would be built on the engine thread)."""
        options.check_text("the prediction", prediction)
        try:
            tokens = self.model.tokenize(prediction, add_special=False, parse_special=False, limit=self.n_ctx)
            has = f"{len(tokens)}"
        except TooManyTokens as exc:
            tokens, has = None, f"at least {exc.count}"
        if tokens is None or len(tokens) > self.n_ctx:
            raise LocalspecError(f"the prediction has {has} tokens, more than the context of {self.n_ctx} "
                                 "(n_ctx) holds")
        return tuple(tokens)

    def check_grammar(self, grammar: str, triggers: Sequence[str] = ()) -> None:
        """Raise the GrammarError a generation with this grammar would raise at its start (a front
        end's early check: a server answers 400 before it streams): beyond the limits, not valid,
        or (not lazy) allowing no text at all. Safe on another thread than the one generating:
        it reads only the vocabulary."""
        compiled = Grammar(self.model, grammar, triggers)
        try:
            if not triggers and not np.isfinite(compiled.mask(np.zeros(self.model.n_vocab, np.float32))).any():
                raise GrammarError("the grammar allows no text at all (no token may start it, not even the end)")
        finally:
            compiled.close()

    # -- cost model --------------------------------------------------------------------------------
    def cost_key(self) -> str:
        """What the cost model's figures hold for: this machine, thread count, offload, KV type and files."""
        return "|".join((cost_cache.machine_key(self.ctx.n_threads, self._n_gpu_layers),
                         f"kv={self._kv_type or '-'}", cost_cache.file_key(self.target_info.path),
                         cost_cache.file_key(self.drafter_info.path if self.drafter_info is not None else None)
                         + ("|mtp" if self.mtp_heads else "")))

    def calibrate_in_background(self) -> None:
        """Have a cost model without making a request wait for one: the cached calibration at once,
        else one measured in the background while the engine is idle (:mod:`.calibrator`)."""
        if self.spec_note is not None:   # it never drafts (runtime.recurrent): nothing to plan
            return
        if self.cost is None:
            self.cost = costmodel.cached(self.cost_key(), user_dir() / "calibration.json", self._verbose_note)
            if self.cost is not None:
                self.calibrator.state = "cached"
        if self.cost is None or self.cost.provisional:
            self.calibrator.start()

    def planning_cost(self) -> costmodel.CostModel:
        """The cost model a generation plans with now, never waiting: the cached or measured one,
        else a guess the generation's own cycles correct (:func:`costmodel.prior`) while a
        calibration runs whenever the engine is idle."""
        self.calibrate_in_background()
        if self.cost is None:
            self.cost = costmodel.prior(self.cost_key(), user_dir() / "calibration.json")
        return self.cost

    def cost_model(self, *, refresh: bool = False, cancel: threading.Event | None = None) -> costmodel.CostModel:
        """Verify cost by batch size and drafter step cost on this machine: from the cache in
        ``user_dir()/calibration.json`` or measured now (``cancel`` cuts it short), waiting for a
        background calibration under way. Call it between generations (bench does, before it times)."""
        if not refresh and (self.cost is None or self.cost.provisional) and self.calibrator.busy:
            self.calibrator.wait()
        if self.cost is not None and not self.cost.provisional and not refresh:
            return self.cost
        self.cost = costmodel.load_or_calibrate(self.cost_key(), user_dir() / "calibration.json",
                                                lambda: self._measure_costs(cancel), refresh=refresh,
                                                note=self._verbose_note)
        return self.cost

    def _measure_costs(self, cancel=None):
        """A calibration on sequence 0 (emptied) and the drafter's first sequences: every slot's
        drafter pairs count as gone (call it while no generation runs)."""
        try:
            return calibrate(self.verifier, self.drafter, cancel)
        finally:
            for verifier in self.verifiers:
                verifier.drafter_pairs = 0

    def _measured_cost(self, verify, drafter_step, drafter_width, complete: bool) -> costmodel.CostModel:
        return costmodel.measured(self.cost_key(), user_dir() / "calibration.json",
                                  (verify, drafter_step, drafter_width, complete))

    def _install_cost(self, model: costmodel.CostModel, complete: bool) -> None:
        self.cost = model

    def _verbose_note(self, text: str) -> None:
        if self._verbose:
            print(f"note: {text}", file=sys.stderr)

    def clear_cache(self) -> None:
        """Forget the cached prompt prefix: the next generation prefills its whole prompt.

        The KV rows of a prompt prefilled in one large batch differ in the last bits from rows
        decoded one at a time (llama.cpp picks other kernels for large batches), so two generations
        compare exactly only from the same cache state (bench clears it before every run). The
        recalled text of earlier generations goes too: the next one drafts only from its own."""
        self.recall.clear()
        self.verifier.forget()
        if self.drafter is not None:
            self.drafter.reset(0)

    # -- life cycle ------------------------------------------------------------------------------
    def close(self) -> None:
        calibrator = getattr(self, "calibrator", None)
        if calibrator is not None:
            calibrator.close()   # before the contexts go
        cost = getattr(self, "cost", None)
        if cost is not None:
            cost.save_if_drifted()
            self.cost = None
        drafter = getattr(self, "drafter", None)
        if drafter is not None:
            drafter.close()
            self.drafter = None
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        if getattr(self, "model", None) is not None:
            self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
