"""Do localspec's MTP drafts equal llama.cpp's own ``draft-mtp`` drafts, for the same file and context?

    python bench/peer_mtp_drafts.py --tool PATH/llama-speculative-simple [--heads 1] [-n 48] [--k 4]
        [--head-noise 0.05] [--prompt TEXT ...] [-v]
    python bench/peer_mtp_drafts.py --tool PATH/llama-speculative-simple --assistant [-n 48] [--k 4]

It writes a tiny step35 target with MTP heads (tests/mtp_models.py), runs llama.cpp's
``llama-speculative-simple --spec-type draft-mtp`` on it greedily with debug logging, and reads
every draft llama.cpp made (``draft candidate 0`` of each step) and each cycle's acceptance, which
fix the context of every draft: the committed tokens ``x_0..x_{n-1}`` and ``id_last = x_n``. For
each, localspec's :class:`~localspec.speculation.mtp.MtpDrafter` drafts from the same context (the
target prefilled with ``x_0..x_{n-1}``, its first token ``x_n``, the head's catch-up and greedy
chain) and the two drafts are compared token by token. Then localspec generates the same text
greedily with ``--source mtp`` (the drafter's real, incremental path) and its drafts made after
the same committed length as one of llama.cpp's are compared too. ``--tool``: the tool built from the pinned
sdist (``bench/peer_llamacpp.py`` builds one into ``~/.cache/localspec/peer``). ``p_min`` is 0 on
both sides (llama.cpp's draft probability comes from a top-10 softmax, localspec's from the whole
vocabulary: they would stop at different depths, never on different tokens).

``--assistant``: a tiny gemma4 target and its gemma4-assistant (tests/gemma4_models.py, an assistant
whose drafts depend on the target's state and cache: ``state`` and ``head_noise`` large), given to
the tool as the draft model (``-md``), which draft-mtp runs in its shared-KV mode; localspec's
:class:`~localspec.speculation.assistant.AssistantDrafter` drafts from the same contexts, and the
top-10 probability of each draft is compared too.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from engine_checks import prefill  # noqa: E402 (tests/ on the path first)

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
_CAND = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_PROB = re.compile(r"draft candidate\s+0, pos\s+\d+:\s+-?\d+ \(\s*([0-9.]+)\)")
_ACC = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")


def native_drafts(tool: Path, target: Path, n: int, k: int, prompt: str = PROMPT, draft: Path | None = None,
                  probs: list | None = None) -> tuple[list[list[int]], list[int]]:
    """llama.cpp's drafts, one list per draft call, and each cycle's accepted count (``draft``: a
    draft model, ``-md``; ``probs`` gets each draft token's top-10 probability, in order)."""
    cmd = [str(tool), "-m", str(target), "-p", prompt, "-n", str(n), "--temp", "0", "--spec-type", "draft-mtp",
           "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0", "-c", "512", "-lv", "5", "-t", "2"]
    if draft is not None:
        cmd += ["-md", str(draft)]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{tool.name} failed ({proc.returncode}):\n{log[-3000:]}")
    calls: list[list[int]] = []
    accepted: list[int] = []
    for line in log.splitlines():
        m = _CAND.search(line)
        if m:
            pos, tok = int(m.group(1)), int(m.group(2))
            if pos == 0:
                calls.append([])
            calls[-1].append(tok)
            if probs is not None:
                probs.append(float(_PROB.search(line).group(1)))
            continue
        m = _ACC.search(line)
        if m:
            accepted.append(int(m.group(1)))
    return calls, accepted


def localspec_draft(engine, prefix: list[int], k: int, id_last: int | None = None,
                    probs: list | None = None) -> list[int]:
    """The target's next token after ``prefix``, then the drafter's greedy chain from ``id_last``
    (default: that token; speculative-simple's first id_last is the prompt's last token instead);
    ``probs`` gets each draft's probability among its top 10 (draft-mtp's top-k sampler)."""
    from localspec.runtime.sampling import SamplingParams, Sampler

    engine.clear_cache()
    drafter = engine.drafters[0]   # the drafter's sequence 0
    first = prefill(engine, prefix, Sampler(SamplingParams(), prefix), drafter)
    if not k:
        return [first]
    if drafter.name == "assistant":   # the pair (id_last, h_{n-1}) at pos0 = n
        drafter._last = (first if id_last is None else id_last, drafter._last[1], drafter._last[2])
    else:
        drafter._pending_tokens[-1] = first if id_last is None else id_last   # the pair (id_last, h_{n-1})
    logits, state = drafter.catch_up()
    out = []
    for i in range(k):
        tok = int(np.argmax(logits))
        out.append(tok)
        if probs is not None:
            top = np.sort(np.asarray(logits, dtype=np.float64))[-10:]
            probs.append(float(np.exp(top[-1] - top.max()) / np.exp(top - top.max()).sum()))
        if i + 1 < k:
            logits, state = drafter.decode([tok], state[None, :], len(prefix) + i)
    return [first] + out


def generation_drafts(engine, prompt: str, n: int, k: int) -> dict[int, list[int]]:
    """The drafts MtpDrafter made during a real greedy generation (``--source mtp``, fixed chains
    of ``k``), keyed by the committed length they drafted after (prompt and generated tokens, the
    last of them the chain's ``id_last``): the drafter's incremental path (rows observed after each
    verification, catch-up over them), recorded by wrapping the drafter's own calls."""
    from localspec.core.events import DoneEvent
    from localspec.runtime.config import GenerationConfig
    from localspec.speculation.policy import PolicyConfig

    engine.clear_cache()
    drafter, backend, drafts, inside = engine.drafters[0], engine.drafter, [], [False]
    catch_up, decode, decode_steps = drafter.catch_up, drafter.decode, backend.decode_steps

    def wrapped_catch_up(*a, **kw):
        inside[0] = True
        try:
            logits, state = catch_up(*a, **kw)
        finally:
            inside[0] = False
        drafts.append([int(np.argmax(logits))])
        return logits, state

    def wrapped_decode(tokens, g, pos):
        logits, state = decode(tokens, g, pos)
        if not inside[0] and drafts:
            drafts[-1].append(int(np.argmax(logits)))
        return logits, state

    def wrapped_decode_steps(rows):   # a scheduler's chain steps (one slot here: one row each)
        inside[0] = True
        try:
            out = decode_steps(rows)
        finally:
            inside[0] = False
        if drafts:
            drafts[-1].extend(int(np.argmax(logits)) for logits, _ in out)
        return out

    drafter.catch_up, drafter.decode, backend.decode_steps = wrapped_catch_up, wrapped_decode, wrapped_decode_steps
    try:
        from localspec.runtime.sampling import SamplingParams

        cfg = GenerationConfig(max_tokens=n, sampling=SamplingParams(temperature=0.0, repeat_penalty=1.0),
                               policy=PolicyConfig("fixed", k, tree="off", source=drafter.name, p_min=0.0))
        done = [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]
    finally:
        del drafter.catch_up, drafter.decode, backend.decode_steps
    out, n_prompt, done_n = list(done.tokens), len(engine.prompt_tokens(prompt)), 1
    keyed = {}
    for draft in drafts:
        keyed[n_prompt + done_n] = draft
        acc = 0
        while acc < len(draft) and done_n + acc < len(out) and draft[acc] == out[done_n + acc]:
            acc += 1
        done_n += acc + 1
    return keyed


PROMPTS = [PROMPT, "One, two, three, four, five, six, seven", "def fibonacci(n):\n    if n < 2:\n        return n",
           "Once upon a time, in a small village by the sea, there lived"]


def compare(engine, tool: Path, target: Path, prompt: str, n: int, k: int, verbose: bool,
            draft: Path | None = None, gaps: list | None = None) -> list[int]:
    """[draft tokens equal, draft tokens, drafts equal, drafts] for one prompt, from the same
    contexts; then the same four for the drafts of localspec's own generation made after the same
    committed length as one of llama.cpp's. ``gaps`` gets each draft token's top-10 probability
    difference (llama.cpp logs 3 decimals)."""
    native_p: list[float] = []
    mine_p: list[float] = []
    calls, accepted = native_drafts(tool, target, n, k, prompt, draft, native_p)
    tokens = engine.prompt_tokens(prompt)
    n_past = len(tokens) - 1   # speculative-simple keeps the prompt's last token as id_last
    same = steps = whole = 0
    native: dict[int, list[int]] = {}
    for call, acc in zip(calls, accepted + [0]):
        prefix = tokens[:n_past]
        native[n_past + 1] = call
        mine = localspec_draft(engine, prefix, len(call), tokens[n_past], mine_p)[1:]
        same += sum(1 for a, b in zip(mine, call) if a == b)
        steps += len(call)
        whole += mine == call
        if verbose or mine != call:
            print(f"n_past {n_past:3d}  llama.cpp {call}  localspec {mine}  {'=' if mine == call else 'DIFFER'}")
        # the committed text grows by the accepted drafts and the target's token
        tokens = tokens[:n_past + 1] + call[:acc]
        bonus = localspec_draft(engine, tokens, 0)[0]   # the target's next token after them
        tokens.append(bonus)
        n_past += acc + 1
    if gaps is not None and len(native_p) == len(mine_p):
        gaps.extend(abs(a - b) for a, b in zip(native_p, mine_p))
    generated = generation_drafts(engine, prompt, n, k)
    g_same = g_steps = g_whole = g_n = 0
    for key in sorted(set(native) & set(generated)):
        call, mine = native[key], generated[key]
        m = min(len(call), len(mine))   # the last drafts may be cut by the tokens left
        g_same += sum(1 for a, b in zip(mine[:m], call[:m]) if a == b)
        g_steps += m
        g_whole += mine[:m] == call[:m]
        g_n += 1
        if verbose or mine[:m] != call[:m]:
            print(f"generate, after {key:3d}  llama.cpp {call}  localspec {mine}  "
                  f"{'=' if mine[:m] == call[:m] else 'DIFFER'}")
    return [same, steps, whole, len(calls), g_same, g_steps, g_whole, g_n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", type=Path, required=True)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--assistant", action="store_true", help="a gemma4 target and its assistant (-md)")
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head-noise", type=float, default=0.005,
                    help="the heads' random part (0.005: mostly 'the same token again'; 0.5 and more: drafts "
                         "that depend on the target's state and the head's own cache)")
    ap.add_argument("--prompt", action="append", help="repeatable; default: four prompts")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every draft, not only those that differ")
    args = ap.parse_args(argv)
    from localspec import Engine

    totals = [0] * 8
    gaps: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        target, draft = _files(Path(d), args)
        with Engine(target, draft, n_ctx=512) as engine:
            for prompt in args.prompt or PROMPTS:
                got = compare(engine, args.tool, target, prompt, args.n, args.k, args.verbose, draft, gaps)
                print(f"{prompt[:40]!r}: {got[0]}/{got[1]} draft tokens, {got[2]}/{got[3]} drafts equal; "
                      f"during generate: {got[4]}/{got[5]} tokens, {got[6]}/{got[7]} drafts")
                totals = [a + b for a, b in zip(totals, got)]
    print(f"heads {args.heads}, head noise {args.head_noise}: {totals[0]}/{totals[1]} draft tokens equal, "
          f"{totals[2]}/{totals[3]} drafts equal; drafts of localspec's generate after the same committed "
          f"length: {totals[4]}/{totals[5]} tokens, {totals[6]}/{totals[7]} drafts equal")
    if gaps:
        print(f"top-10 probability of each draft: largest difference {max(gaps):.2e} over {len(gaps)} "
              "(llama.cpp logs 3 decimals)")
    return 0 if totals[0] == totals[1] and totals[4] == totals[5] else 1


def _files(d: Path, args) -> tuple[Path, Path | None]:
    """The target (and the draft model) the comparison runs on."""
    if args.assistant:
        from gemma4_models import build_gemma4_assistant, build_gemma4_target

        return (build_gemma4_target(d / "gemma4.gguf"),
                build_gemma4_assistant(d / "assistant.gguf", head_noise=0.4, state=0.5))
    from mtp_models import build_mtp_target

    return build_mtp_target(d / "mtp.gguf", heads=args.heads, seed=args.seed, head_noise=args.head_noise), None


if __name__ == "__main__":
    sys.exit(main())
