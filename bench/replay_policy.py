"""Replay the ``auto`` policy's lookup decisions on recorded greedy output, without timing noise.

    python bench/replay_policy.py [--prompts bench/chat.jsonl ...] -n 192 --threads 2

For every prompt the engine decodes plainly (greedy) once; then, offline, the lookup source and
``auto``'s :class:`~localspec.speculation.policy.DraftPolicy` (its priors, shadow scoring and
statistics carried from prompt to prompt, as in one engine) replay that text cycle by cycle, each
draft accepted up to the first token that differs from the recorded output (greedy verification
accepts exactly that). A cycle costs the calibrated verify time of its batch (the engine's cost
model for ``--threads``), so the result, tokens per one-token-step time over plain decoding's,
says what the policy's choices are worth on this machine with no Python overhead and no shared
machine's slow spells. llama.cpp's ``ngram-mod`` (24-token n-grams, drafts of 48-64 tokens only,
common/speculative.cpp) is replayed the same way, with every n-gram of the history known (the
native one adds them in chunks of 32), for comparison.

A measured run (``bench/peer_llamacpp.py``) less this replay is what the policy's cost model does
not see: Python per cycle, a slower step after a large batch. ``hindsight`` is the most any policy
could make of the same lookup proposals knowing the text ahead (:func:`replay_hindsight`). For
people who measure; CI does not run it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localspec.core.errors import LocalspecError
from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.runtime.bench import load_prompts
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.runtime.drafting import DraftStep
from localspec.runtime.verifier import Verified
from localspec.speculation import tree
from localspec.speculation.costmodel import CostModel
from localspec.speculation.lookup import NgramLookup
from localspec.speculation.policy import MAX_DEPTH, DraftPolicy, Learned, PolicyConfig
from localspec.store.models import resolve

SETS = ("chat", "copy", "coding", "repetitive")
MOD_N, MOD_MIN, MOD_MAX = 24, 48, 64   # llama.cpp's ngram-mod defaults (common/common.h)


def replay_auto(texts: list[tuple[list[int], list[int]]], cost: CostModel) -> float:
    """Speed over plain decoding of ``auto``'s lookup drafts on (prompt, greedy output) pairs."""
    learned = Learned()
    steps = tokens = 0.0
    v1 = cost.verify(1)
    for prompt, output in texts:
        learned.new_generation()
        policy = DraftPolicy(PolicyConfig("auto"), cost, lookup=True, learned=learned)
        # the engine's own draft step: the lookup source, its shadow score and the policy as wired there
        step = DraftStep(policy, None, NgramLookup(prompt + output[:1]), tree.Calibration(), policy.config.draft_max)
        pos = 1
        while pos < len(output):
            draft = step.draft(len(output) - pos - 1, len(prompt) + pos - 1)
            drafts = draft.tokens
            accepted = 0
            while accepted < len(drafts) and output[pos + accepted] == drafts[accepted]:
                accepted += 1
            rows = policy.verify_rows(len(drafts) + 1) if drafts else 1
            seconds = cost.verify(rows)
            committed = output[pos:pos + accepted + 1]
            step.record(draft, Verified(len(prompt) + pos - 1, committed, list(range(accepted + 1)), len(drafts),
                                        rows, seconds))
            policy.observe(draft.source if drafts else None, len(drafts), accepted, verify_seconds=seconds,
                           drafter_seconds=0.0, cycle_seconds=seconds, batch=rows)
            pos += len(committed)
            tokens += len(committed)
            steps += seconds / v1
    return tokens / steps


def replay_ngram_mod(texts: list[tuple[list[int], list[int]]], cost: CostModel) -> float:
    steps = tokens = 0.0
    v1 = cost.verify(1)
    for prompt, output in texts:
        seq, pos = prompt + output, len(prompt) + 1
        while pos < len(seq):
            table = {tuple(seq[j:j + MOD_N]): seq[j + MOD_N] for j in range(pos - MOD_N)}
            chain = seq[pos - MOD_N:pos]
            for _ in range(MOD_MAX):
                nxt = table.get(tuple(chain[-MOD_N:]))
                if nxt is None:
                    break
                chain.append(nxt)
            drafts = chain[MOD_N:] if len(chain) - MOD_N >= MOD_MIN else []
            accepted = 0
            while accepted < len(drafts) and pos + accepted < len(seq) and seq[pos + accepted] == drafts[accepted]:
                accepted += 1
            steps += cost.verify(len(drafts) + 1) / v1
            pos += accepted + 1
            tokens += accepted + 1
    return tokens / steps


def replay_hindsight(texts: list[tuple[list[int], list[int]]], cost: CostModel) -> float:
    """The best any policy could do with the lookup source's proposals, knowing the text ahead: at
    each position either a plain step or a draft of exactly as many of the proposal's tokens as
    the text goes on with (padded as auto pads), the cheapest sequence of cycles (dynamic
    programming over positions). An upper bound for ``auto``'s lookup choices, not a policy."""
    steps = tokens = 0.0
    v1 = cost.verify(1)
    for prompt, output in texts:
        n = len(output)
        lookup, agree = NgramLookup(prompt + output[:1]), [0] * (n + 1)
        for pos in range(1, n):
            start, match = lookup.find()
            proposal = lookup.continuation(start, min(MAX_DEPTH, n - pos)) if match else []
            while agree[pos] < len(proposal) and output[pos + agree[pos]] == proposal[agree[pos]]:
                agree[pos] += 1
            lookup.extend(output[pos:pos + 1])
        best = [0.0] * (n + 1)   # best[pos]: cheapest seconds from pos to the end
        for pos in range(n - 1, 0, -1):
            best[pos] = min([v1 + best[pos + 1]] + [min(cost.verify(k + 1), cost.verify(cost.rows_for(k + 1)))
                                                    + best[pos + k + 1] for k in range(1, min(agree[pos], n - pos - 1) + 1)])
        steps += best[1] / v1
        tokens += n - 1
    return tokens / steps if steps else 1.0   # outputs of one token: nothing to speed up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", action="append", type=Path, help="bench JSONL files (default: the four peer sets)")
    ap.add_argument("-n", "--max-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    paths = args.prompts or [Path(__file__).with_name(f"{name}.jsonl") for name in SETS]
    spec = resolve(args.model)
    with Engine(Path(spec.target), None, n_ctx=4096, n_threads=args.threads) as engine:
        live = engine.cost_model()
        cost = CostModel({b: live.verify(b) for b in range(1, 130)})   # the replay's own copy: it learns
        print(f"{args.threads} threads, V(k)/V(1): " + " ".join(
            f"{b}:{cost.verify(b) / cost.verify(1):.1f}" for b in (2, 4, 8, 16, 32, 64, 128)))
        for path in paths:
            texts = []
            for bp in load_prompts(path):
                messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
                for event in engine.generate(messages, GenerationConfig(max_tokens=args.max_tokens, spec=False)):
                    if isinstance(event, DoneEvent):
                        texts.append((engine.prompt_tokens(messages), list(event.tokens)))
            auto, mod = replay_auto(texts, cost), replay_ngram_mod(texts, cost)
            best = replay_hindsight(texts, CostModel({b: live.verify(b) for b in range(1, 130)}))
            print(f"{path.stem:12} auto {auto:.3f}x plain   ngram-mod {mod:.3f}x plain   auto / ngram-mod {auto / mod:.3f}x"
                  f"   hindsight {best:.3f}x plain")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except LocalspecError as exc:   # a bad --model or --threads: one line, as the CLI says it
        raise SystemExit(f"Error: {exc}") from None
