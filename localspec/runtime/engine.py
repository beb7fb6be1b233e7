"""The engine: a target model, an optional EAGLE drafter, and generation as a stream of events.

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
lazily, only before it drafts). With ``spec=False`` the same loop runs with no drafts: plain decoding.
"""

from __future__ import annotations

import codecs
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..formats.chat_format import ChatFormatter, Message
from ..core import options
from ..core.errors import LocalspecError
from ..core.events import CycleEvent, DoneEvent, Event, GenerationStats, TokenEvent
from ..formats.gguf_info import GGUFInfo, check_pair, check_target, read_gguf
from ..llama.llama_model import Context, Model, set_verbose
from .sampling import Sampler, SamplingParams
from ..core.paths import user_dir
from ..speculation import costmodel
from ..speculation.eagle import DRAFTER_BATCH, EagleDrafter
from ..speculation.lookup import NgramLookup, ShadowScore
from ..speculation import tree
from ..speculation.policy import (EAGLE, LOOKUP, TREE, DraftPolicy, Learned,
                                 PolicyConfig, top1_probability)

PROMPT_BATCH = 512


def target_context(with_drafter: bool) -> dict:
    """Sequence settings of the target context (localspec.memory.fit reserves the same): with a drafter,
    draft trees are verified in one batch, each leaf a sequence of one unified cache (the tree's
    rows share the prefix cells; see speculation.tree)."""
    return dict(n_seq_max=1 + tree.MAX_NODES, kv_unified=True) if with_drafter else {}


@dataclass
class GenerationConfig:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    spec: bool = True                      # speculate: the drafter when loaded and/or n-gram lookup
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    record_margins: bool = False           # keep each token's top-1 minus top-2 logit (bench)
    parse_special: bool = True             # a raw str prompt: "<|im_start|>" etc. become special tokens

    def __post_init__(self) -> None:
        # ranges: localspec.core.options; the policy and sampling values check themselves
        self.max_tokens = options.check("max_tokens", self.max_tokens)
        self.stop = options.check_stop(self.stop)
        if not isinstance(self.sampling, SamplingParams):
            raise LocalspecError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        if not isinstance(self.policy, PolicyConfig):
            raise LocalspecError(f"policy must be PolicyConfig, got {type(self.policy).__name__}")


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
        chat_template: str | None = None,
    ) -> None:
        set_verbose(verbose)
        self.target_info: GGUFInfo = read_gguf(target)
        check_target(self.target_info)
        self.drafter_info: GGUFInfo | None = None
        if drafter is not None:
            self.drafter_info = read_gguf(drafter)
            check_pair(self.target_info, self.drafter_info)
        n_ctx = options.check_n_ctx(n_ctx, self.target_info.n_ctx_train, model=self.target_info.path.name)
        if n_threads is not None:
            n_threads = options.check_threads(n_threads)
        n_gpu_layers = options.check("gpu_layers", n_gpu_layers)
        drafter_gpu_layers = options.check("gpu_layers", drafter_gpu_layers)
        # memory plan hook (localspec.memory.fit): KV type, verify-sized logit rows, the plan to report against
        self.plan = plan
        from ..memory.fit import KV_TYPES
        if kv_type is not None and kv_type not in KV_TYPES:
            raise LocalspecError(f"unknown KV cache type '{kv_type}' ({', '.join(KV_TYPES)})")
        self.model = Model(self.target_info.path, n_gpu_layers=n_gpu_layers)
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=PROMPT_BATCH, n_threads=n_threads,
                           kv_type=KV_TYPES[kv_type][0] if kv_type else None, n_outputs_max=n_outputs_max,
                           **target_context(self.drafter_info is not None))
        self.drafter: EagleDrafter | None = None
        try:
            if self.drafter_info is not None:
                self.drafter = EagleDrafter(self.drafter_info, self.ctx, n_ctx=n_ctx, n_batch=DRAFTER_BATCH,
                                            n_threads=n_threads, n_gpu_layers=drafter_gpu_layers)
        except BaseException:
            self.close()
            raise
        # a Modelfile's TEMPLATE (Jinja) replaces the one in the GGUF
        self.formatter = ChatFormatter(
            chat_template if chat_template is not None else self.target_info.chat_template,
            from_modelfile=chat_template is not None,
            bos_token=self.model.piece(self.model.bos).decode("utf-8", "replace") if self.model.bos >= 0 else "",
            eos_token=self.model.piece(self.model.eos).decode("utf-8", "replace") if self.model.eos >= 0 else "",
            name=("the Modelfile TEMPLATE" if chat_template is not None
                  else f"the chat template of {self.target_info.path.name}"),
        )
        self._n_gpu_layers, self._kv_type = n_gpu_layers, kv_type
        self._verbose = verbose
        self.cost: costmodel.CostModel | None = None  # verify/drafter costs, calibrated on first use
        self.learned = Learned()  # the auto policy's acceptance statistics, across generations
        self.tree_calibration = tree.Calibration()  # draft probability -> acceptance, for trees
        self._kv_tokens: list[int] = []  # tokens whose target KV rows are valid, positions 0..len-1
        self._drafter_pairs = 0          # drafter pairs for positions 0..n-1 are written or recorded
        self._lock = threading.Lock()

    # -- prompts ---------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def prompt_tokens(self, prompt: str | Sequence[Message | dict], *, parse_special: bool = True) -> list[int]:
        """Tokens for a raw text prompt (str) or a chat (messages, rendered with the model's template).

        In a raw prompt, special-token text such as ``<|im_start|>`` becomes the special token, as
        llama.cpp's tools parse it; ``parse_special=False`` keeps it plain text."""
        if isinstance(prompt, str):
            options.check_text("the prompt", prompt)
            tokens = self.model.tokenize(prompt, add_special=True, parse_special=parse_special)
        else:
            options.check_messages(prompt)
            text = self.formatter.render(prompt, add_generation_prompt=True)
            tokens = self.model.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.model.bos:
            tokens = tokens[1:]  # the template (or the raw prompt) wrote BOS itself
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
        tokens = self.prompt_tokens(prompt, parse_special=config.parse_special)
        if not tokens:
            raise LocalspecError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise LocalspecError(
                f"the prompt has {len(tokens)} tokens, more than the context of {self.n_ctx} (n_ctx) allows; "
                "shorten it or use a larger context"
            )
        if not self._lock.acquire(blocking=False):
            raise LocalspecError("the engine is already generating")
        try:
            yield from self._generate(tokens, config, cancel)
        finally:
            self._lock.release()

    def _generate(self, prompt: list[int], config: GenerationConfig, cancel: threading.Event | None) -> Iterator[Event]:
        pcfg = config.policy
        drafter = self.drafter if config.spec and pcfg.source in ("auto", EAGLE) else None
        use_lookup = config.spec and pcfg.source in ("auto", LOOKUP)
        cost = (self.cost_model(cancel=cancel) if pcfg.name == "auto" and (drafter is not None or use_lookup)
                else None)
        sampler = Sampler(config.sampling, prompt)   # the context repetition penalties count
        self.learned.new_generation()
        policy = DraftPolicy(pcfg, cost, eagle=drafter is not None, lookup=use_lookup, learned=self.learned)
        stats = GenerationStats(prompt_tokens=len(prompt), spec=policy.active)
        stream = _TextStream(config.stop)
        model, ctx = self.model, self.ctx

        # --- prompt: reuse the cached prefix, decode the rest ---
        t_start = time.perf_counter()
        first = self._prefill(prompt, sampler, drafter)
        d_logits = d_state = None  # the drafter's first-draft logits/state, once caught up
        # margins are those of the logits the choice was made from (penalised, if penalties are on)
        prefill_margin = _margin(sampler.penalised(ctx.logits(-1))) if config.record_margins else 0.0
        sampler.commit([first])
        lookup = NgramLookup(prompt + [first]) if policy.lookup else None
        shadow = ShadowScore(policy.observe_lookup) if lookup is not None and not policy.fixed else None
        stats.prompt_seconds = time.perf_counter() - t_start

        t_gen = time.perf_counter()
        drafter_t0 = drafter.seconds if drafter else 0.0
        out: list[int] = []
        margins: list[float] | None = [prefill_margin] if config.record_margins else None
        finish = None
        pending = [(first, False)]          # tokens chosen but not yet emitted
        cycle: tuple[int, int, str | None] | None = None  # (drafted, accepted, source) of the last cycle
        last = first                        # at position n_past, not yet in the target KV
        n_past = len(prompt)
        carry: list[int] = []               # committed tokens before ``last``, not yet in the KV

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
                yield CycleEvent(cycle[0], cycle[1], emitted, stats.snapshot(), cycle[2])
            if finish is None and cancel is not None and cancel.is_set():
                finish = "cancelled"
            if finish is None and n_past >= self.n_ctx:
                finish = "context"
            if finish:
                break

            # --- one cycle: choose, draft, verify in one target batch, accept ---
            t_cycle = time.perf_counter()
            room = min(self.n_ctx - 1 - n_past, config.max_tokens - len(out) - 1,
                       ctx.n_outputs_max - 1 - len(carry))  # rows with logits in one batch
            drafts: list[int] = []
            proposal, match = lookup.propose(policy.lookup_depth(room)) if lookup is not None else ([], 0)
            source, k = policy.plan(room, len(proposal), match, drafter.pending if drafter is not None else 0)
            if shadow is not None:
                shadow.add(proposal, match)
            d_t0 = drafter.seconds if drafter is not None else 0.0
            d_steps = 0
            draft_tree = None
            if source == LOOKUP:
                drafts = proposal[:k]
            elif source == EAGLE:
                if d_logits is None:  # feed the rows committed since the last draft
                    d_steps = drafter.pending if policy.catch_up_rows is None else min(drafter.pending, policy.catch_up_rows)
                    d_logits, d_state = drafter.catch_up(policy.catch_up_rows)
                logits, state = d_logits, d_state
                shape = policy.tree_plan(k, room)
                if shape is not None:
                    draft_tree = tree.build(drafter, logits, state, n_past, depth=k, width=shape[0],
                                            max_nodes=shape[1])
                    if not policy.fixed:  # cut to the size with the best expected rate
                        draft_tree = tree.prune(draft_tree, self.tree_calibration, cost.verify,
                                                drafter.seconds - d_t0 + policy.overhead)
                    source = TREE
                while draft_tree is None and len(drafts) < k:
                    tok, prob = top1_probability(logits)
                    if not policy.keep_drafting(prob):
                        break
                    drafts.append(tok)
                    if len(drafts) < k:
                        logits, state = drafter.decode([tok], state[None, :], n_past + len(drafts) - 1)
                        d_steps += 1

            # the batch: committed tokens not yet in the KV cache (``carry``: a tree's accepted
            # path beyond the rows kept in place), the last token, then the drafts
            base = len(carry)
            kv_start = n_past - base
            t0 = time.perf_counter()
            if draft_tree is not None:
                path, rows, kept, correction = self._verify_tree(carry, last, draft_tree, n_past, sampler)
                drafts = [draft_tree.tokens[i] for i in path]
                accepted = len(path)
                n_drafted = len(draft_tree)
            else:
                ctx.decode(carry + [last] + drafts, kv_start, all_logits=bool(drafts))
                accepted, correction = 0, -1
                for i, d in enumerate(drafts):
                    ok, tok = sampler.verify(ctx.logits(base + i), d, drafts[:i])
                    if not ok:
                        correction = tok
                        break
                    accepted += 1
                if correction < 0:
                    correction = sampler.choose(ctx.logits(base + len(drafts) if drafts else -1), drafts)
                if accepted < len(drafts):
                    ctx.seq_rm(n_past + accepted + 1)
                rows = list(range(base, base + accepted + 1))
                kept = accepted
                n_drafted = len(drafts)
            t_verify = time.perf_counter() - t0
            stats.record_verify(base + n_drafted + 1, t_verify)
            pending = [(d, True) for d in drafts[:accepted]] + [(correction, False)]
            if margins is not None:  # bench bookkeeping, not counted as generation time
                t_m = time.perf_counter()
                margins.extend(_margin(sampler.penalised(ctx.logits(r), drafts[:j]))  # row j follows j drafts
                               for j, r in enumerate(rows if drafts or draft_tree else [-1]))
                t_gen += time.perf_counter() - t_m
                t_cycle += time.perf_counter() - t_m

            del self._kv_tokens[kv_start:]
            self._kv_tokens.extend(carry + [last] + drafts[:kept])
            carry = drafts[kept:accepted]
            committed = [t for t, _ in pending]
            if drafter is not None:
                if policy.wants_features:
                    drafter.observe(committed, accepted + 1, n_past, rows)
                else:  # the drafter will not draft soon: skip the copy (it restarts from later rows)
                    drafter.drop_pending()
                d_logits = d_state = None
                self._drafter_pairs = n_past + accepted + 1
            sampler.commit(committed)
            if lookup is not None:
                lookup.extend(committed)
                if shadow is not None:
                    shadow.commit(committed)
            n_past += accepted + 1
            last = correction
            if source == EAGLE and not drafts:
                policy.eagle_declined()
            source = source if n_drafted else None
            stats.record_cycle(n_drafted, accepted, source,
                               depth=draft_tree.depth if draft_tree is not None else None)
            policy.observe(source, n_drafted, accepted, verify_seconds=t_verify,
                           drafter_seconds=(drafter.seconds - d_t0) if drafter is not None else 0.0,
                           cycle_seconds=time.perf_counter() - t_cycle, drafter_steps=d_steps,
                           depth=draft_tree.depth if draft_tree is not None else None)
            cycle = (n_drafted, accepted, source)

        tail = stream.flush()
        if tail:
            yield TokenEvent(tail, -1, False)
        stats.generation_seconds = time.perf_counter() - t_gen
        stats.policy_choices = dict(policy.choices)
        yield DoneEvent(stream.text, out, finish, stats.snapshot(),
                        margins[: len(out)] if margins is not None else None)

    def _verify_tree(self, carry: list[int], last: int, draft_tree: tree.DraftTree, n_past: int,
                     sampler: Sampler) -> tuple[list[int], list[int], int, int]:
        """Verify ``carry + [last]`` and the tree (depth-first, most probable chain first) in one
        target decode. Returns (accepted nodes, the batch rows of ``last`` and of those nodes, how
        many of the nodes keep their KV rows, the target's next token).

        Only an accepted path that fills the rows right after ``last`` keeps its KV rows in place:
        the cells of rejected rows before an accepted one would be refilled later by later
        positions, and attention over cells out of position order sums in another order (on
        SmolLM2 that alone moves logits by up to ~0.8). The rest of the path goes back into the
        next batch (``carry``), so the cache always reads as plain decoding wrote it."""
        ctx = self.ctx
        base = len(carry)
        sets = draft_tree.leaf_sets()
        order = draft_tree.preorder()
        n_leaves = len(sets[0])
        for s in range(1, n_leaves + 1):  # every leaf's sequence sees the committed prefix
            ctx.seq_cp(0, s)
        head = [1 + x for x in sets[0]]
        try:
            ctx.decode_tree(carry + [last] + [draft_tree.tokens[i] for i in order],
                            list(range(n_past - base, n_past + 1)) + [n_past + draft_tree.depths[i] for i in order],
                            [head] * (base + 1) + [[1 + x for x in sets[i + 1]] for i in order])
            row_of = {node: base + 1 + r for r, node in enumerate(order)}
            tokens = draft_tree.tokens

            def choose(node: int) -> int:  # the target's token after ``node``, its path before it
                after = [tokens[i] for i in draft_tree.path_to(node)] if sampler.penalties is not None else ()
                return sampler.choose(ctx.logits(base if node < 0 else row_of[node]), after)

            path, correction = tree.walk(draft_tree, choose)
            kept = 0
            while kept < len(path) and row_of[path[kept]] == base + 1 + kept:
                kept += 1
            leaf = 1 + sets[path[-1] + 1 if path else 0][0]  # its sequence holds the whole path
            ctx.seq_cp(leaf, 0, n_past - base, n_past + kept + 1)
        finally:
            for s in range(1, n_leaves + 1):  # frees the other rows' cells
                ctx.seq_rm(-1, -1, seq=s)
        self.tree_calibration.learn(draft_tree, path)
        return path, [base] + [row_of[i] for i in path], kept, correction

    # -- cost model --------------------------------------------------------------------------------
    def cost_model(self, *, refresh: bool = False, cancel: threading.Event | None = None) -> costmodel.CostModel:
        """Verify cost by batch size and drafter step cost on this machine: from the cache in
        ``user_dir()/calibration.json`` or measured now (a few hundred ms; ``cancel`` cuts it short)."""
        if self.cost is not None and not refresh:
            return self.cost
        key = "|".join((costmodel.machine_key(self.ctx.n_threads, self._n_gpu_layers),
                        f"kv={self._kv_type or '-'}", costmodel._file_key(self.target_info.path),
                        costmodel._file_key(self.drafter_info.path if self.drafter is not None else None)))
        self.cost = costmodel.load_or_calibrate(key, user_dir() / "calibration.json",
                                                lambda: self._calibrate(cancel), refresh=refresh,
                                                note=self._verbose_note)
        return self.cost

    def _verbose_note(self, text: str) -> None:
        if self._verbose:
            print(f"note: {text}", file=sys.stderr)

    def _calibrate(self, cancel: threading.Event | None = None) -> tuple[dict[int, float], float | None,
                                                                          float | None, bool]:
        """Time target decodes of each batch size (logits for every row) after a short context, one
        drafter step and one step of ``tree.WIDTH`` branches: (seconds by batch size, drafter step,
        branch step / drafter step, complete). Leaves both caches empty."""
        deadline = time.perf_counter() + costmodel.BUDGET_SECONDS

        def stop() -> bool:  # an oversubscribed machine can make decodes 100x slower: keep what we have
            return time.perf_counter() > deadline or (cancel is not None and cancel.is_set())
        ctx = self.ctx
        n_ctx_room = self.n_ctx - 1
        base = min(128, n_ctx_room // 2, ctx.n_batch)   # one decode (a small --ctx gives a small n_batch)
        limit = min(ctx.n_outputs_max, ctx.n_batch, n_ctx_room - base)
        sizes = [b for b in list(range(1, costmodel.CALIBRATE_MAX + 1)) + list(costmodel.EXTRA_SIZES) if b <= limit]
        filler = [self.model.bos if self.model.bos >= 0 else 0] + [(i * 7919) % self.model.n_vocab for i in range(1, base)]
        ctx.seq_rm(0)
        self._kv_tokens, self._drafter_pairs = [], 0
        if base:
            ctx.decode(filler, 0, all_logits=False)
        tok = filler[-1] if filler else 0

        def verify(b: int) -> None:
            ctx.decode([tok] * b, base, all_logits=True)
            ctx.seq_rm(base)

        verify_costs = costmodel.measure(verify, sizes, stop=stop)
        ctx.seq_rm(0)
        drafter_step = drafter_width = None
        if self.drafter is not None:
            d = self.drafter
            g = np.zeros((1, d.n_embd), dtype=np.float32)

            def step(_b: int) -> None:
                d.decode([tok], g, 0)
                d.ctx.seq_rm(0)

            drafter_step = costmodel.measure(step, [1])[1]
            d.reset(0)
            seqs = list(range(1, tree.WIDTH + 1))
            gw = np.zeros((tree.WIDTH, d.n_embd), dtype=np.float32)

            def branches(_b: int) -> None:
                d.decode_branches([tok] * tree.WIDTH, gw, 0, seqs)
                for s in seqs:
                    d.forget(s)

            drafter_width = costmodel.measure(branches, [1])[1] / drafter_step
        return verify_costs, drafter_step, drafter_width, len(verify_costs) == len(sizes)

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

    def clear_cache(self) -> None:
        """Forget the cached prompt prefix: the next generation prefills its whole prompt.

        The KV rows of a prompt prefilled in one large batch differ in the last bits from rows
        decoded one at a time (llama.cpp picks other kernels for large batches), so two generations
        compare exactly only from the same cache state (bench clears it before every run)."""
        self.ctx.seq_rm(0)
        self._kv_tokens = []
        self._drafter_pairs = 0
        if self.drafter is not None:
            self.drafter.reset(0)

    def memory_report(self) -> dict:
        """llama.cpp's allocated buffers (weights, KV, compute, output) vs the plan, if one was given."""
        from ..memory.fit import memory_report

        return memory_report(self)

    # -- life cycle ------------------------------------------------------------------------------
    def close(self) -> None:
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
