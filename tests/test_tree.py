"""Draft trees: structure, pruning by cost, verification in one target decode, losslessness."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec import CycleEvent, DoneEvent, Engine, GenerationConfig, LocalspecError, PolicyConfig
from localspec.formats import gguf_consts as K
from localspec.speculation import tree as T
from localspec.speculation.costmodel import CostModel
from localspec.speculation.policy import DraftPolicy
from engine_checks import PROMPTS, assert_lossless, run
from tiny_models import build_drafter, build_target

ROOT = Path(__file__).resolve().parents[1]
GPU = {b: 0.010 + 0.0002 * b for b in range(1, 41)}   # verify nearly flat in batch size
CPU = {b: 0.005 * b for b in range(1, 41)}            # verify linear in batch size


def sample_tree() -> T.DraftTree:
    """root -> a (0.6) -> c (0.5) -> f (0.9); a -> d (0.3); root -> b (0.3) -> e (0.8)."""
    t = T.DraftTree()
    a = t.add(10, -1, 0.6)
    b = t.add(11, -1, 0.3)
    c = t.add(12, a, 0.5)
    d = t.add(13, a, 0.3)
    t.add(14, b, 0.8)
    t.add(15, c, 0.9)
    assert (a, b, c, d) == (0, 1, 2, 3)
    return t


def test_tree_structure_leaves_and_preorder():
    t = sample_tree()
    assert t.depth == 3 and t.depths == [1, 1, 2, 2, 2, 3]
    assert t.scores[5] == pytest.approx(0.6 * 0.5 * 0.9)
    sets = t.leaf_sets()
    leaves = sorted(x for s in sets[1:] for x in s if len(s) == 1)
    assert sorted(sets[0]) == [0, 1, 2] and len(set(leaves)) == 3       # three leaves: f, d, e
    assert set(sets[1]) == set(sets[3]) | set(sets[4])                  # a's leaves: below c and d
    # depth first, most probable child first: the most probable chain a, c, f leads
    assert t.preorder() == [0, 2, 5, 3, 1, 4]
    assert t.path_to(5) == [0, 2, 5]


def test_top_keeps_parents_and_the_most_probable_nodes():
    t = sample_tree()
    top = t.top(3)
    assert sorted(top.tokens) == [10, 11, 12]   # a 0.6, c 0.3, b 0.3 (d 0.18 and f 0.27 lose)
    for i, p in enumerate(top.parents):
        assert p < i
    # weights that rank a deep node first still bring its ancestors along
    w = [0.1, 0.1, 0.1, 0.1, 0.1, 0.9]
    assert sorted(t.top(3, w).tokens) == [10, 12, 15]


def test_walk_follows_the_target_and_returns_its_next_token():
    t = sample_tree()
    choices = {-1: 10, 0: 12, 2: 99}
    path, nxt = T.walk(t, lambda node: choices[node])
    assert path == [0, 2] and nxt == 99
    path, nxt = T.walk(t, lambda node: {-1: 11, 1: 14, 4: 7}[node])
    assert path == [1, 4] and nxt == 7
    path, nxt = T.walk(t, lambda node: 42)
    assert path == [] and nxt == 42


def test_calibration_learns_acceptance_by_probability_band():
    cal = T.Calibration()
    assert cal.rate(0.95) == pytest.approx(0.95)      # the prior is the draft probability itself
    t = sample_tree()
    for _ in range(400):                                 # the target always takes b, never a
        cal.learn(t, [1, 4])
    assert cal.rate(0.6) < 0.1 and cal.rate(0.3) > 0.8
    est = cal.expected(t)
    assert est[4] == pytest.approx(cal.rate(0.3) * cal.rate(0.8))


def test_prune_keeps_big_trees_where_verify_is_flat_and_small_ones_where_it_is_linear():
    t = T.DraftTree()
    for i in range(4):                          # a wide first level, each with one child
        p = t.add(i, -1, 0.25)
        t.add(10 + i, p, 0.9)
    cal = T.Calibration()
    gpu = T.prune(t, cal, CostModel(GPU).verify, 0.001)
    cpu = T.prune(t, cal, CostModel(CPU).verify, 0.001)
    assert len(gpu) == len(t)
    assert len(cpu) < len(gpu) and len(cpu) >= 1


def test_auto_grows_trees_only_where_width_is_nearly_free():
    gpu = DraftPolicy(PolicyConfig("auto", 8), CostModel(GPU, 0.0005, drafter_width=1.1), eagle=True)
    cpu = DraftPolicy(PolicyConfig("auto", 8), CostModel(CPU, 0.002, drafter_width=3.0), eagle=True)
    unknown = DraftPolicy(PolicyConfig("auto", 8), CostModel(GPU, 0.0005), eagle=True)
    assert gpu.tree_plan(4, 100) == (4, 24)
    assert cpu.tree_plan(4, 100) is None and unknown.tree_plan(4, 100) is None
    off = DraftPolicy(PolicyConfig("auto", 8, tree="off"), CostModel(GPU, 0.0005, drafter_width=1.1), eagle=True)
    assert off.tree_plan(4, 100) is None
    on = DraftPolicy(PolicyConfig("fixed", 4, tree="on", tree_nodes=10), None, eagle=True)
    assert on.tree_plan(4, 100) == (4, 10)
    assert on.tree_plan(4, 4) is None            # no room for more than a chain


def test_bad_tree_settings():
    with pytest.raises(LocalspecError, match="tree setting"):
        GenerationConfig(policy=PolicyConfig(tree="maybe"))
    with pytest.raises(LocalspecError, match="tree width"):
        GenerationConfig(policy=PolicyConfig(tree_width=0))
    with pytest.raises(LocalspecError, match="tree nodes"):
        GenerationConfig(policy=PolicyConfig(tree_nodes=T.MAX_NODES + 1))


# -- the engine ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree")
    paths = {"repeat": build_target(d / "repeat.gguf", "repeat"),
             "noisy": build_target(d / "noisy.gguf", "noisy", noise=0.006),
             "random": build_target(d / "random.gguf", "random")}
    paths["d_repeat"] = build_drafter(d / "d_repeat.gguf", paths["repeat"], "repeat")
    paths["d_random"] = build_drafter(d / "d_random.gguf", paths["repeat"], "random")
    paths["d_31"] = build_drafter(d / "d_31.gguf", paths["repeat"], "repeat", variant=K.VARIANT_EAGLE31)
    subset = np.sort(np.random.default_rng(3).choice(49152, 6000, replace=False))
    paths["d_d2t"] = build_drafter(d / "d_d2t.gguf", paths["repeat"], "repeat", d2t=subset)
    return paths


@pytest.mark.parametrize("target,drafter,depth,width", [
    ("noisy", "d_repeat", 4, 4), ("noisy", "d_31", 3, 2), ("random", "d_random", 4, 8),
    ("noisy", "d_d2t", 6, 3), ("repeat", "d_repeat", 5, 4),
])
def test_greedy_trees_are_lossless(tiny, target, drafter, depth, width):
    with Engine(tiny[target], tiny[drafter], n_ctx=1024) as engine:
        for prompt in PROMPTS:
            plain = run(engine, prompt, max_tokens=40, spec=False, record_margins=True)
            cfg = PolicyConfig("fixed", depth, tree="on", tree_width=width, tree_nodes=16)
            spec = run(engine, prompt, max_tokens=40, policy=cfg)
            assert_lossless(plain, spec)
            assert spec.stats.policy_choices["tree"] > 0
            assert spec.stats.sources["tree"][1] > 0


def test_tree_cycles_report_nodes_depth_and_the_cache_stays_usable(tiny):
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        events = list(engine.generate(PROMPTS[1], GenerationConfig(
            max_tokens=60, policy=PolicyConfig("fixed", 4, tree="on", tree_nodes=12))))
        cycles = [e for e in events if isinstance(e, CycleEvent) and e.source == "tree"]
        assert cycles and all(c.drafted <= 12 and c.accepted <= 4 for c in cycles)
        stats = events[-1].stats
        assert len(stats.drafted_per_position) == 4   # per depth, not per node
        assert stats.tokens_per_cycle >= 1.0
        # the follow-up reuses the cached prefix written by tree cycles
        plain = run(engine, PROMPTS[1] + " again", max_tokens=30, spec=False, record_margins=True)
        engine.clear_cache()
        fresh = run(engine, PROMPTS[1] + " again", max_tokens=30, spec=False, record_margins=True)
        assert_lossless(fresh, plain)


def test_trees_on_the_default_pair_are_lossless_and_accept_more_than_chains(smollm2):
    """The real SmolLM2 target with the shipped drafter on held-out chat prompts."""
    drafter = ROOT / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "bench" / "heldout.jsonl").read_text().splitlines()
               if line.strip()][:3]
    chain_tpc, tree_tpc = [], []
    with Engine(smollm2, drafter, n_ctx=2048) as engine:
        for p in prompts:
            msgs = [{"role": "user", "content": p}]
            engine.clear_cache()
            plain = run(engine, msgs, max_tokens=48, spec=False, record_margins=True)
            engine.clear_cache()
            chain = run(engine, msgs, max_tokens=48, policy=PolicyConfig("fixed", 4, tree="off"))
            engine.clear_cache()
            treed = run(engine, msgs, max_tokens=48, policy=PolicyConfig("fixed", 4, tree="on"))
            assert_lossless(plain, chain)
            assert_lossless(plain, treed)
            chain_tpc.append(chain.stats.tokens_per_cycle)
            tree_tpc.append(treed.stats.tokens_per_cycle)
    assert sum(tree_tpc) > sum(chain_tpc) + 0.1 * len(prompts)


def test_each_tree_row_sees_exactly_its_ancestors(smollm2):
    """One tree decode gives every node the logits of decoding its own path as a chain."""
    from localspec.llama.llama_model import Context, Model

    model = Model(smollm2)
    ctx = Context(model, n_ctx=512, n_batch=512, n_threads=1, n_seq_max=1 + T.MAX_NODES, kv_unified=True)
    try:
        prompt = model.tokenize("The capital of France is Paris. The capital of Italy is", add_special=True)
        n_past, last = len(prompt) - 1, prompt[-1]
        toks = model.tokenize(" Rome Milan is was the", add_special=False)
        t = sample_tree()
        t.tokens = [toks[i % len(toks)] for i in range(len(t))]
        ctx.decode(prompt[:-1], 0, all_logits=False)
        sets = t.leaf_sets()
        for s in range(1, len(sets[0]) + 1):
            ctx.seq_cp(0, s)
        ctx.decode_tree([last] + t.tokens, [n_past] + [n_past + d for d in t.depths],
                        [[1 + x for x in leaves] for leaves in sets])
        rows = [np.array(ctx.logits(i)) for i in range(len(t) + 1)]
        for s in range(1, len(sets[0]) + 1):
            ctx.seq_rm(-1, -1, seq=s)
        assert ctx.pos_max(0) == n_past - 1        # the tree left the committed cache as it was
        for node in range(-1, len(t)):
            path = [] if node < 0 else t.path_to(node)
            ctx.seq_rm(n_past)
            ctx.decode([last] + [t.tokens[i] for i in path], n_past, all_logits=True)
            assert np.abs(np.array(ctx.logits(len(path))) - rows[node + 1]).max() < 1e-3, node
    finally:
        ctx.close()
        model.close()
