"""DFlash and DSpark drafts against llama.cpp's own: ``llama-speculative-simple --spec-type
draft-dflash`` / ``draft-dspark`` of the pinned sdist (tests/peer_tool.py: where it is built) on the
tiny llama target with the tiny drafters of tests/dflash_models.py, greedy, full blocks
(``--spec-draft-p-min 0``). Its debug log (``-lv 5``) gives every draft (``draft candidate 0`` of
each block row) and each cycle's accepted count and new token, which fix each draft's context:
the committed tokens and the anchor (``id_last``). localspec's block drafter drafts again from each
of those contexts and must draft the same tokens; localspec's own greedy generation (fixed blocks
of the same size) must draft the same tokens after the same committed text, and its output must
be the tool's."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from dflash_models import build_dflash
from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig
from peer_tool import native_tool
from tiny_models import build_target

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
N, K = 32, 4   # tokens generated, block drafts per cycle (--spec-draft-n-max)
_CAND = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_ACC = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")
_ENC = re.compile(r"encoded\s+(\d+) tokens")
_COUNTS = re.compile(r"n_drafted\s*=\s*(\d+)\s*\n.*?n_accept\s*=\s*(\d+)", re.S)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    tool = native_tool()
    if tool is None:
        pytest.skip("llama-speculative-simple of the pinned llama.cpp is not built (bench/peer_llamacpp.py builds "
                    "it into ~/.cache/localspec/peer; LOCALSPEC_PEER_TOOL names another)")
    d = tmp_path_factory.mktemp("dflash_peer")
    paths = {"tool": tool, "noisy": build_target(d / "noisy.gguf", "noisy", noise=0.006)}
    for name in ("dflash", "dflash_random", "dspark", "dspark_random"):
        paths[name] = build_dflash(d / f"{name}.gguf", kind="random" if name.endswith("random") else "repeat",
                                   dspark=name.startswith("dspark"))
    return paths


def native_run(tool, target, drafter, kind: str) -> dict:
    """The tool's drafts (one list per block), each cycle's (accepted, drafted, new token), the
    prompt's token count and its n_drafted / n_accept."""
    cmd = [str(tool), "-m", str(target), "-md", str(drafter), "-p", PROMPT, "-n", str(N), "--temp", "0",
           "--seed", "1", "--spec-type", f"draft-{kind}", "--spec-draft-n-max", str(K), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-c", "512", "-lv", "5", "-t", "1", "-tb", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    drafts: list[list[int]] = []
    cycles: list[tuple[int, int, int]] = []
    last_pos = None
    for line in log.splitlines():
        m = _CAND.search(line)
        if m:
            pos, tok = int(m.group(1)), int(m.group(2))
            if last_pos is None or pos <= last_pos:   # a new block
                drafts.append([])
            drafts[-1].append(tok)
            last_pos = pos
            continue
        m = _ACC.search(line)
        if m:
            cycles.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
            last_pos = None
    counts = _COUNTS.search(log)
    return {"drafts": drafts, "cycles": cycles, "prompt_tokens": int(_ENC.search(log).group(1)),
            "n_drafted": int(counts.group(1)), "n_accept": int(counts.group(2))}


def contexts(prompt: list[int], native: dict) -> list[tuple[list[int], int]]:
    """Each of the tool's drafts' context (committed tokens, anchor), and the text it committed:
    speculative-simple decodes the prompt but its last token, which anchors the first block; each
    cycle commits the anchor and the accepted drafts, and its new token anchors the next block."""
    committed, anchor, out = list(prompt[:-1]), prompt[-1], []
    for draft, (accepted, n_draft, new) in zip(native["drafts"], native["cycles"]):
        assert n_draft <= len(draft), (draft, n_draft)   # the last cycle's draft is cut to the tokens left
        out.append((list(committed), anchor))
        committed += [anchor] + draft[:accepted]
        anchor = new
    return out, committed + [anchor]


def localspec_draft(engine, committed: list[int], anchor: int) -> list[int]:
    """localspec's block from a context: the target decodes the committed tokens, the drafter
    injects their layer inputs and drafts ``K`` after the anchor."""
    engine.clear_cache()
    d = engine.drafters[0]   # the block drafter's sequence 0
    engine.ctx.seq_rm(0)
    engine.ctx.decode(committed, 0, all_logits=False)
    d.begin(committed, 0)
    d.observe(committed[1:] + [anchor], len(committed), 0)
    tokens, _ = d.draft_block(K)
    return tokens


def generation_drafts(engine, kind: str) -> tuple[dict[int, list[int]], list[int]]:
    """The blocks localspec drafted in its own greedy generation (fixed blocks of ``K``), keyed by
    the anchor's position (the committed length), and the generated tokens."""
    engine.clear_cache()
    part, seen = engine.drafter.kind, {}   # the block drafter's per-kind part
    block = part.decode_block

    def recorded(d, anchor, pos0, n, who):
        tokens, conf = block(d, anchor, pos0, n, who)
        seen[pos0] = list(tokens)
        return tokens, conf

    part.decode_block = recorded
    try:
        cfg = GenerationConfig(max_tokens=N, policy=PolicyConfig("fixed", K, p_min=0.0, source=kind, tree="off",
                                                                 recall=False))
        done = [e for e in engine.generate(PROMPT, cfg) if isinstance(e, DoneEvent)][0]
    finally:
        del part.decode_block
    return seen, list(done.tokens)


@pytest.mark.parametrize("drafter", ["dflash", "dflash_random", "dspark", "dspark_random"])
def test_dflash_and_dspark_drafts_are_llama_cpp_s_own_draft_dflash_and_draft_dspark_drafts(pairs, drafter):
    """Every block llama.cpp drafted, drafted again by localspec from the same context, is token for
    token the same; localspec's generation drafts the same blocks after the same committed text,
    and its greedy output is the tool's."""
    kind = "dspark" if drafter.startswith("dspark") else "dflash"
    native = native_run(pairs["tool"], pairs["noisy"], pairs[drafter], kind)
    with Engine(pairs["noisy"], pairs[drafter], n_ctx=512, n_threads=1) as engine:
        prompt = engine.model.tokenize(PROMPT)
        assert native["prompt_tokens"] == len(prompt)
        ctxs, text = contexts(prompt, native)
        assert len(ctxs) >= 4 and native["n_drafted"] == sum(c[1] for c in native["cycles"])
        mine = [localspec_draft(engine, committed, anchor) for committed, anchor in ctxs]
        seen, generated = generation_drafts(engine, kind)
    assert mine == native["drafts"][:len(ctxs)]
    # a block of fewer rows is another computation (every row attends to the whole block): the
    # tool always decodes K rows (its last draft is cut afterwards), localspec fewer near the end
    common = {len(c): native["drafts"][i] for i, (c, _) in enumerate(ctxs)}
    both = sorted(p for p in set(common) & set(seen) if len(seen[p]) == K)
    assert both and all(seen[p] == common[p] for p in both), [(p, seen[p], common[p]) for p in both]
    out = text[len(prompt):]
    n = min(len(out), len(generated))
    assert n >= N - 1 and out[:n] == generated[:n], (out, generated)
    assert native["n_accept"] == sum(c[0] for c in native["cycles"])
    if drafter in ("dflash", "dspark"):   # drafts of the last token again: the noisy target takes many
        assert native["n_accept"] > len(ctxs), native["cycles"]
    assert np.all([len(x) == K for x in mine])
