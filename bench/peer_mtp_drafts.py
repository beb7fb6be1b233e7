"""Do localspec's MTP drafts equal llama.cpp's own ``draft-mtp`` drafts, for the same file and context?

    python bench/peer_mtp_drafts.py --tool PATH/llama-speculative-simple [--heads 1] [-n 48] [--k 4]
    python bench/peer_mtp_drafts.py --tool PATH/llama-speculative-simple --assistant [-n 48] [--k 4]

It writes a tiny step35 target with MTP heads (tests/mtp_models.py), runs llama.cpp's
``llama-speculative-simple --spec-type draft-mtp`` on it greedily with debug logging, and reads
every draft llama.cpp made (``draft candidate 0`` of each step) and each cycle's acceptance, which
fix the context of every draft: the committed tokens ``x_0..x_{n-1}`` and ``id_last = x_n``. For
each, localspec's :class:`~localspec.speculation.mtp.MtpDrafter` drafts from the same context (the
target prefilled with ``x_0..x_{n-1}``, its first token ``x_n``, the head's catch-up and greedy
chain) and the two drafts are compared token by token. ``--tool``: the tool built from the pinned
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

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
_CAND = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_PROB = re.compile(r"draft candidate\s+0, pos\s+\d+:\s+-?\d+ \(\s*([0-9.]+)\)")
_ACC = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")


def native_drafts(tool: Path, target: Path, n: int, k: int, draft: Path | None = None,
                  probs: list | None = None) -> tuple[list[list[int]], list[int]]:
    """llama.cpp's drafts, one list per draft call, and each cycle's accepted count (``probs``: gets
    each draft token's top-10 probability, in order)."""
    cmd = [str(tool), "-m", str(target), "-p", PROMPT, "-n", str(n), "--temp", "0", "--spec-type", "draft-mtp",
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
    drafter = engine.drafter
    first = engine.verifier.prefill(prefix, Sampler(SamplingParams(), prefix), drafter)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", type=Path, required=True)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--assistant", action="store_true", help="a gemma4 target and its assistant (-md)")
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args(argv)
    from localspec import Engine

    with tempfile.TemporaryDirectory() as d:
        target, draft = _files(Path(d), args)
        native_p: list[float] = []
        calls, accepted = native_drafts(args.tool, target, args.n, args.k, draft, native_p)
        mine_p: list[float] = []
        with Engine(target, draft, n_ctx=512) as engine:
            tokens = engine.prompt_tokens(PROMPT)
            n_past = len(tokens) - 1   # speculative-simple keeps the prompt's last token as id_last
            same = steps = 0
            for call, acc in zip(calls, accepted + [0]):
                prefix = tokens[:n_past]
                mine = localspec_draft(engine, prefix, len(call), tokens[n_past], mine_p)[1:]
                agree = sum(1 for a, b in zip(mine, call) if a == b)
                same += agree
                steps += len(call)
                print(f"n_past {n_past:3d}  llama.cpp {call}  localspec {mine}  {'=' if mine == call else 'DIFFER'}")
                # the committed text grows by the accepted drafts and the target's token
                tokens = tokens[:n_past + 1] + call[:acc]
                bonus = localspec_draft(engine, tokens, 0)[0]   # the target's next token after them
                tokens.append(bonus)
                n_past += acc + 1
        print(f"{same}/{steps} draft tokens equal over {len(calls)} drafts")
        if native_p and len(native_p) == len(mine_p):
            gap = max(abs(a - b) for a, b in zip(native_p, mine_p))
            print(f"top-10 probability of each draft: largest difference {gap:.2e} "
                  f"(llama.cpp logs 3 decimals; {len(native_p)} drafts)")
    return 0 if same == steps else 1


def _files(d: Path, args) -> tuple[Path, Path | None]:
    """The target (and the draft model) the comparison runs on."""
    if args.assistant:
        from gemma4_models import build_gemma4_assistant, build_gemma4_target

        return (build_gemma4_target(d / "gemma4.gguf"),
                build_gemma4_assistant(d / "assistant.gguf", head_noise=0.4, state=0.5))
    from mtp_models import build_mtp_target

    return build_mtp_target(d / "mtp.gguf", heads=args.heads), None


if __name__ == "__main__":
    sys.exit(main())
