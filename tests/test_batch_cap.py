"""Every verify (a chain, auto's padded chain, a tree) and every drafter batch fits the real batch
size of its llama.cpp context (issue 29). At a small --ctx llama.cpp grows the context but keeps
n_batch at the requested size, so a setting the options table accepts used to end in
"internal: batch of 64 exceeds n_batch 48". Hypothesis drives the policy, tree and draft settings at
small contexts on tiny models; the real SmolLM2 pair runs the reported commands."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from localspec import DoneEvent, Engine, GenerationConfig, PolicyConfig
from localspec.core import options
from localspec.llama.contexts import VERIFY_OUTPUTS_MAX
from tiny_models import build_drafter, build_target

# long repeats: lookup matches far longer than a small batch, the drafter right on most tokens
PROMPT = "the quick brown fox jumps over the lazy dog. " * 3
CTXS = (16, 24, 32, 48, 64)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("cap")
    target = build_target(d / "t.gguf", "repeat")
    drafter = build_drafter(d / "d.gguf", target, "repeat")
    # as the CLI opens them (the memory plan asks for VERIFY_OUTPUTS_MAX logit rows) and as the
    # Python API does by default
    opened = {(ctx, rows): Engine(target, drafter, n_ctx=ctx, n_outputs_max=rows)
              for ctx in CTXS for rows in (0, VERIFY_OUTPUTS_MAX)}
    yield opened
    for engine in opened.values():
        engine.close()


SETTINGS = st.fixed_dictionaries({
    "name": st.sampled_from(["auto", "fixed"]),
    "draft_max": st.integers(1, options.DRAFT_MAX),
    "tree": st.sampled_from(["auto", "on", "off"]),
    "tree_width": st.integers(1, options.TREE_MAX_WIDTH),
    "tree_nodes": st.integers(1, options.TREE_MAX_NODES),
    "source": st.sampled_from(["auto", "eagle", "lookup"]),
    "lookup_max": st.integers(1, options.LOOKUP_MAX),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ctx=st.sampled_from(CTXS), rows=st.sampled_from((0, VERIFY_OUTPUTS_MAX)), policy=SETTINGS)
@example(ctx=24, rows=VERIFY_OUTPUTS_MAX, policy=dict(name="fixed", draft_max=32, tree="on", tree_width=4,
                                                      tree_nodes=24, source="auto", lookup_max=128))
@example(ctx=16, rows=VERIFY_OUTPUTS_MAX, policy=dict(name="fixed", draft_max=32, tree="off", tree_width=4,
                                                      tree_nodes=24, source="lookup", lookup_max=128))
def test_any_accepted_setting_runs_at_a_small_context(engines, ctx, rows, policy):
    engine = engines[ctx, rows]
    assert engine.ctx.n_outputs_max <= engine.ctx.n_batch
    config = GenerationConfig(max_tokens=80, policy=PolicyConfig(**policy))
    done = [e for e in engine.generate(PROMPT, config) if isinstance(e, DoneEvent)]
    assert len(done) == 1 and done[0].tokens
    assert done[0].finish_reason in ("length", "context", "stop")


@pytest.mark.parametrize("flags", [
    ["--ctx", "48", "--max-tokens", "200"],
    ["--ctx", "24", "--tree", "on", "--policy", "fixed", "--draft-max", "32"],
])
def test_the_reported_commands_run_on_the_real_pair(flags):
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", "--prompt",
                           "Repeat the following line ten times: the quick brown fox jumps over the lazy dog",
                           *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Error" not in proc.stderr and proc.stdout.strip()
