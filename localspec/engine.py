"""The engine: a target model, an optional EAGLE drafter, and generation as a stream of events.

    engine = Engine("target.gguf", drafter="drafter.gguf")
    for event in engine.generate([Message("user", "Hi")], GenerationConfig(max_tokens=64)):
        if isinstance(event, TokenEvent):
            print(event.text, end="")

Each cycle: draft a chain from the drafter, verify ``[last, d1..dk]`` in ONE target decode, accept
the longest prefix the target agrees with (greedy: argmax; sampling: rejection rule of
:mod:`localspec.sampling`), trim the target KV cache to the committed tokens, and feed the committed
positions' target features back into the drafter. With no drafter (or ``spec=False``) the same loop
runs with no drafts: plain decoding.
"""

from __future__ import annotations

import codecs
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .chat_format import ChatFormatter, Message
from .errors import LocalspecError
from .events import CycleEvent, DoneEvent, Event, GenerationStats, TokenEvent
from .gguf_info import GGUFInfo, check_pair, check_target, read_gguf
from .llama_model import Context, Model, set_verbose
from .sampling import Sampler, SamplingParams
from .speculation.eagle import DRAFTER_BATCH, EagleDrafter
from .speculation.policy import DraftPolicy, PolicyConfig, top1_probability

PROMPT_BATCH = 512


@dataclass
class GenerationConfig:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    spec: bool = True                      # use the drafter when one is loaded
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    record_margins: bool = False           # keep each token's top-1 minus top-2 logit (bench)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise LocalspecError("max tokens must be at least 1")
        if self.policy.name not in ("auto", "fixed"):
            raise LocalspecError(f"unknown policy '{self.policy.name}' (auto or fixed)")
        if not 1 <= self.policy.draft_max <= 32:
            raise LocalspecError("draft-max must be between 1 and 32")


def _margin(logits) -> float:
    """Top-1 minus top-2 logit: how close a greedy choice was to a tie."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


class _TextStream:
    """Turns token bytes into printable text, holding back partial UTF-8 and possible stop strings."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""
        self.text = ""        # released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        self._pending += self._decoder.decode(data)
        if self._stop:
            window = self.text[-self._hold:] + self._pending if self._hold else self._pending
            offset = len(window) - len(self._pending)
            hits = [at for at in (window.find(s) for s in self._stop) if at >= 0]
            if hits:
                self.stopped = True
                return self._release(max(0, min(hits) - offset))
            return self._release(max(0, len(self._pending) - self._hold))
        return self._release(len(self._pending))

    def _release(self, n: int) -> str:
        out, self._pending = self._pending[:n], self._pending[n:]
        if self.stopped:
            self._pending = ""
        self.text += out
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))


class Engine:
    """Target + optional drafter, loaded once; :meth:`generate` may be called many times."""

    def __init__(
        self,
        target: str | Path,
        drafter: str | Path | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        drafter_gpu_layers: int = 0,
        verbose: bool = False,
        kv_type: str | None = None,
        n_outputs_max: int = 0,
        plan=None,
    ) -> None:
        set_verbose(verbose)
        self.target_info: GGUFInfo = read_gguf(target)
        check_target(self.target_info)
        self.drafter_info: GGUFInfo | None = None
        if drafter is not None:
            self.drafter_info = read_gguf(drafter)
            check_pair(self.target_info, self.drafter_info)
        if n_ctx < 16:
            raise LocalspecError("context size must be at least 16 tokens")
        # memory plan hook (localspec.fit): KV type, verify-sized logit rows, the plan to report against
        self.plan = plan
        from .fit import KV_TYPES
        if kv_type is not None and kv_type not in KV_TYPES:
            raise LocalspecError(f"unknown KV cache type '{kv_type}' ({', '.join(KV_TYPES)})")
        self.model = Model(self.target_info.path, n_gpu_layers=n_gpu_layers)
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=PROMPT_BATCH, n_threads=n_threads,
                           kv_type=KV_TYPES[kv_type][0] if kv_type else None, n_outputs_max=n_outputs_max)
        self.drafter: EagleDrafter | None = None
        try:
            if self.drafter_info is not None:
                self.drafter = EagleDrafter(self.drafter_info, self.ctx, n_ctx=n_ctx, n_batch=DRAFTER_BATCH,
                                            n_threads=n_threads, n_gpu_layers=drafter_gpu_layers)
        except BaseException:
            self.close()
            raise
        self.formatter = ChatFormatter(
            self.target_info.chat_template,
            bos_token=self.model.piece(self.model.bos).decode("utf-8", "replace") if self.model.bos >= 0 else "",
            eos_token=self.model.piece(self.model.eos).decode("utf-8", "replace") if self.model.eos >= 0 else "",
        )
        self._kv_tokens: list[int] = []  # tokens whose target KV rows are valid, positions 0..len-1
        self._drafter_pairs = 0          # drafter pairs for positions 0..n-1 are written or recorded
        self._lock = threading.Lock()

    # -- prompts ---------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def prompt_tokens(self, prompt: str | Sequence[Message | dict]) -> list[int]:
        """Tokens for a raw text prompt (str) or a chat (messages, rendered with the model's template)."""
        if isinstance(prompt, str):
            return self.model.tokenize(prompt, add_special=True, parse_special=False)
        text = self.formatter.render(prompt, add_generation_prompt=True)
        tokens = self.model.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.model.bos:
            tokens = tokens[1:]  # the template wrote BOS itself
        return tokens

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[Message | dict],
        config: GenerationConfig | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Yield TokenEvents and CycleEvents as tokens are produced, then one DoneEvent."""
        config = config or GenerationConfig()
        tokens = self.prompt_tokens(prompt)
        if not tokens:
            raise LocalspecError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise LocalspecError(
                f"the prompt has {len(tokens)} tokens, more than the context of {self.n_ctx} allows; "
                "shorten it or raise --ctx"
            )
        if not self._lock.acquire(blocking=False):
            raise LocalspecError("the engine is already generating")
        try:
            yield from self._generate(tokens, config, cancel)
        finally:
            self._lock.release()

    def _generate(self, prompt: list[int], config: GenerationConfig, cancel: threading.Event | None) -> Iterator[Event]:
        drafter = self.drafter if config.spec else None
        sampler = Sampler(config.sampling)
        policy = DraftPolicy(config.policy)
        stats = GenerationStats(prompt_tokens=len(prompt), spec=drafter is not None)
        stream = _TextStream(config.stop)
        model, ctx = self.model, self.ctx

        # --- prompt: reuse the cached prefix, decode the rest ---
        t_start = time.perf_counter()
        first = self._prefill(prompt, sampler, drafter)
        d_logits = d_state = None  # the drafter's first-draft logits/state, once caught up
        prefill_margin = _margin(ctx.logits(-1)) if config.record_margins else 0.0
        stats.prompt_seconds = time.perf_counter() - t_start

        t_gen = time.perf_counter()
        drafter_t0 = drafter.seconds if drafter else 0.0
        out: list[int] = []
        margins: list[float] | None = [prefill_margin] if config.record_margins else None
        finish = None
        pending = [(first, False)]          # tokens chosen but not yet emitted
        cycle: tuple[int, int] | None = None  # (drafted, accepted) of the cycle that chose them
        last = first                        # at position n_past, not yet in the target KV
        n_past = len(prompt)

        while True:
            # emit what the last cycle committed
            emitted = 0
            for tok, from_draft in pending:
                if model.is_eog(tok):
                    finish = "stop"
                    break
                out.append(tok)
                emitted += 1
                text = stream.push(model.piece(tok))
                yield TokenEvent(text, tok, from_draft)
                if stream.stopped:
                    finish = "stop"
                    break
                if len(out) >= config.max_tokens:
                    finish = "length"
                    break
            stats.generated_tokens = len(out)
            stats.generation_seconds = time.perf_counter() - t_gen
            if drafter:
                stats.drafter_seconds = drafter.seconds - drafter_t0
            if cycle is not None:
                yield CycleEvent(cycle[0], cycle[1], emitted, stats.snapshot())
            if finish is None and cancel is not None and cancel.is_set():
                finish = "cancelled"
            if finish is None and n_past >= self.n_ctx:
                finish = "context"
            if finish:
                break

            # --- one cycle: draft, verify in one target batch, accept ---
            t_cycle = time.perf_counter()
            room = min(self.n_ctx - 1 - n_past, config.max_tokens - len(out) - 1)
            drafts: list[int] = []
            k = policy.depth(room) if drafter is not None else 0
            if k > 0:
                if d_logits is None:  # feed the rows committed since the last draft
                    d_logits, d_state = drafter.catch_up()
                logits, state = d_logits, d_state
                while len(drafts) < k:
                    tok, prob = top1_probability(logits)
                    if not policy.keep_drafting(prob):
                        break
                    drafts.append(tok)
                    if len(drafts) < k:
                        logits, state = drafter.decode([tok], state[None, :], n_past + len(drafts) - 1)

            batch = [last] + drafts
            t0 = time.perf_counter()
            ctx.decode(batch, n_past, all_logits=bool(drafts))
            stats.target_seconds += time.perf_counter() - t0

            accepted = 0
            pending = []
            correction = -1
            for i, d in enumerate(drafts):
                ok, tok = sampler.verify(ctx.logits(i), d)
                if not ok:
                    correction = tok
                    break
                accepted += 1
                pending.append((d, True))
            if correction < 0:
                correction = sampler.choose(ctx.logits(len(drafts) if drafts else -1))
            pending.append((correction, False))
            if margins is not None:
                rows = range(accepted + 1) if drafts else [-1]
                margins.extend(_margin(ctx.logits(i)) for i in rows)

            if accepted < len(drafts):
                ctx.seq_rm(n_past + accepted + 1)
            del self._kv_tokens[n_past:]
            self._kv_tokens.extend(batch[: accepted + 1])
            if drafter is not None:
                drafter.observe([t for t, _ in pending], accepted + 1, n_past)
                d_logits = d_state = None
                self._drafter_pairs = n_past + accepted + 1
            n_past += accepted + 1
            last = correction
            if drafts:
                stats.record_cycle(len(drafts), accepted)
            else:
                stats.cycles += 1
            policy.observe(len(drafts), accepted + 1, time.perf_counter() - t_cycle)
            cycle = (len(drafts), accepted)

        tail = stream.flush()
        if tail:
            yield TokenEvent(tail, -1, False)
        stats.generation_seconds = time.perf_counter() - t_gen
        yield DoneEvent(stream.text, out, finish, stats.snapshot(),
                        margins[: len(out)] if margins is not None else None)

    def _prefill(self, prompt: list[int], sampler: Sampler, drafter: EagleDrafter | None) -> int:
        """Bring the target KV cache to the prompt (the drafter records the new rows); return the
        first generated token."""
        ctx = self.ctx
        n = len(prompt)
        common = 0
        for a, b in zip(self._kv_tokens, prompt):
            if a != b:
                break
            common += 1
        # Keep at least one prompt token to decode: its logits choose the first token.
        start = min(common, n - 1)
        self._drafter_pairs = min(self._drafter_pairs, max(0, start - 1))
        if drafter is not None:
            # The drafter's pair at P holds the token at P+1, so its last cached pair is only
            # valid below the first differing token; and it may lag (a run with spec off).
            start = max(0, min(start, common - 1, self._drafter_pairs))
            drafter.reset(start)
        ctx.seq_rm(start)
        self._kv_tokens = prompt[:start]
        first = -1
        pos = start
        while pos < n:
            chunk = prompt[pos: pos + ctx.n_batch]
            ctx.decode(chunk, pos, all_logits=False)
            end = pos + len(chunk)
            self._kv_tokens = prompt[:end]
            if end == n:
                first = sampler.choose(ctx.logits(-1))
            if drafter is not None:
                nxt = prompt[pos + 1: end + 1] if end < n else prompt[pos + 1: n] + [first]
                drafter.observe(nxt, len(chunk), pos)
                self._drafter_pairs = end
            pos = end
        return first

    def memory_report(self) -> dict:
        """llama.cpp's allocated buffers (weights, KV, compute, output) vs the plan, if one was given."""
        from .fit import memory_report

        return memory_report(self)

    # -- life cycle ------------------------------------------------------------------------------
    def close(self) -> None:
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
