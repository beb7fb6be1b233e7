"""DFlash and DSpark block drafters (localspec.speculation.dflash, .block_source) on the tiny llama
target and tiny ``dflash`` drafters written with ``gguf`` (tests/dflash_models.py): loaded by
llama.cpp, checked against their target (one ``Error:`` line for every malformed one, never a
native abort), a block drafted in one decode after the injection of the target's layer inputs,
greedy output equal to plain decoding (1 and 2 threads, chains of fixed depth, auto, two slots),
sampled output from the target's distribution, and auto never drafting with a drafter whose
blocks are garbage. The tests' names say ``dflash`` or ``dspark`` (``pytest -k "dflash or dspark"``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chat_checks import assert_chat_drafts_with
from cli_run import assert_one_error, cli_batch, run_cli
from dflash_models import BLOCK_SIZE, MASK_TOKEN, dflash_set, tiny_checkpoint
from engine_checks import assert_lossless
from localspec import Engine
from localspec.core.errors import LocalspecError
from localspec.core.events import DoneEvent
from localspec.formats.gguf_info import check_pair, read_gguf
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig
from sampling_checks import assert_drafts_keep_the_distribution
from tiny_models import rewrite_gguf

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash")
    paths = dflash_set(d)
    paths["dir"] = d
    return paths


def _done(engine, prompt, cfg) -> DoneEvent:
    return [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]


def test_dflash_and_dspark_drafters_load_and_draft_in_llama_cpp(df):
    """Each fixture, in one child process (a malformed file would abort it): llama.cpp loads the
    pair and ``generate`` drafts under the drafter's own source name."""
    names = ("dflash", "dflash_random", "dspark", "dspark_random", "dspark_noconf")
    procs = cli_batch(*[["generate", "--target", str(df["noisy"]), "--draft", str(df[n]), "-p", PROMPT, "-n", "12",
                         "--policy", "fixed", "--draft-max", "4", "--ctx", "256", "--json"] for n in names])
    for name, proc in zip(names, procs):
        assert proc.returncode == 0, (name, proc.stderr)
        out = json.loads(proc.stdout)
        source = "dspark" if name.startswith("dspark") else "dflash"
        assert out["sources"][source]["drafted"] > 0, (name, out["sources"])


def test_dflash_and_dspark_files_are_recognised_and_named(df):
    for name, kind in (("dflash", "dflash"), ("dspark", "dspark")):
        info = read_gguf(df[name])
        assert info.is_block_drafter and not info.is_drafter and info.block_kind == kind
        assert info.target_layers == (1, 3) and info.mask_token == MASK_TOKEN
        check_pair(read_gguf(df["noisy"]), info)
        proc = run_cli("inspect", str(df[name]), "--json")
        assert proc.returncode == 0, proc.stderr
        desc = json.loads(proc.stdout)
        assert desc["kind"] == "drafter" and desc["draft_source"] == kind and desc["block_size"] == BLOCK_SIZE, desc
    assert json.loads(run_cli("inspect", str(df["dspark"]), "--json").stdout)["confidence_head"] is True


def _hostile_cases(df) -> dict[str, tuple[dict, dict | None, str]]:
    """Malformed block drafters for the tiny llama target: (metadata changes, tensor changes, message)."""
    import gguf

    u32, arr, i32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32
    rng = np.random.default_rng(0)
    n_vocab = read_gguf(df["noisy"]).n_vocab
    return {
        "block0": ({"dflash.block_size": (0, u32)}, None, "block_size must be an integer from 2 to 64"),
        "block1": ({"dflash.block_size": (1, u32)}, None, "block_size must be an integer from 2 to 64"),
        "block_huge": ({"dflash.block_size": (1 << 30, u32)}, None, "block_size must be an integer from 2 to 64"),
        "no_block": ({"dflash.block_size": None}, None, "block_size must be an integer"),
        "layers_range": ({"dflash.target_layers": ([1, 4], arr, i32)}, None, "out of range for noisy.gguf"),
        "layers_none": ({"dflash.target_layers": None}, None, "must list the target layers"),
        "layers_twice": ({"dflash.target_layers": ([1, 1], arr, i32)}, None, "lists a layer twice"),
        "layers_three": ({"dflash.target_layers": ([0, 1, 3], arr, i32)}, None, "fc.weight must take 3 x 64"),
        "mask_out": ({"tokenizer.ggml.mask_token_id": (n_vocab, u32)}, None, "mask token"),
        "mask_none": ({"tokenizer.ggml.mask_token_id": None}, None, "mask token"),
        "markov_rank": ({}, {"markov_w2.weight": rng.standard_normal((n_vocab, 4)).astype(np.float32)},
                        "disagree on its rank"),
        "conf_shape": ({}, {"conf_proj.weight": rng.standard_normal((1, 64)).astype(np.float32)},
                       "conf_proj must be [72, 1]"),
    }


def test_a_hostile_dflash_or_dspark_drafter_is_one_error_line_before_llama_cpp_sees_it(df):
    """Every malformed block drafter, and a DFlash GGUF given as the target: each ``generate`` is
    one ``Error:`` line with exit 1, in one child process that a native abort would kill."""
    cases = _hostile_cases(df)
    files = {name: rewrite_gguf(df["dspark"], df["dir"] / f"bad-{name}.gguf", changes, tensors)
             for name, (changes, tensors, _) in cases.items()}
    commands = [["generate", "--target", str(df["noisy"]), "--draft", str(files[name]), "-p", "hi", "-n", "2"]
                for name in cases]
    commands.append(["generate", "--target", str(df["dflash"]), "-p", "hi", "-n", "2"])
    commands.append(["generate", "--target", str(df["noisy"]), "-p", "hi", "-n", "2", "--source", "dspark"])
    procs = cli_batch(*commands)
    for (name, (_, _, message)), proc in zip(cases.items(), procs):
        assert_one_error(proc, contains=message)
    assert_one_error(procs[-2], contains="is a dflash block drafter, not a target model")
    assert_one_error(procs[-1], contains="source dspark: this engine has no dspark block drafter")
    from dataclasses import replace

    with pytest.raises(LocalspecError, match="must list the target layers"):   # gguf writes no empty array
        check_pair(read_gguf(df["noisy"]), replace(read_gguf(df["dflash"]), target_layers=()))
    with pytest.raises(LocalspecError, match="do not share the same tokenizer"):
        merges = read_gguf(df["noisy"]).path   # the same vocabulary, one merge rule less
        import gguf

        from localspec.llama.gguf_native import GGUFHeader

        kept = list(GGUFHeader(merges).kv["tokenizer.ggml.merges"])[:-1]
        other = rewrite_gguf(df["dflash"], df["dir"] / "other-vocab.gguf",
                             {"tokenizer.ggml.merges": (kept, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)})
        check_pair(read_gguf(df["noisy"]), read_gguf(other))


def test_a_dflash_block_is_one_decode_after_the_injection(df):
    """The repeat drafter drafts the last committed token at every block position, in one drafter
    decode; the block's cells are dropped and the injected context reaches the committed text."""
    with Engine(df["noisy"], df["dflash"], n_ctx=256) as engine:
        d = engine.drafters[0]   # the drafter's sequence 0
        assert d.name == "dflash" and d.max_depth == BLOCK_SIZE - 1
        tokens = engine.model.tokenize(PROMPT)
        engine.ctx.seq_rm(0)
        engine.ctx.decode(tokens, 0, all_logits=False)
        d.begin(tokens, 0)
        d.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)
        seconds = d.seconds
        drafts, confidence = d.draft_block(5)
        assert drafts == [tokens[-1]] * 5 and all(0.0 < p <= 1.0 for p in confidence), (drafts, confidence)
        assert d.ctx.pos_max(0) == len(tokens) - 1 and d.seconds > seconds   # the block's cells are gone
    with Engine(df["noisy"], df["dspark"], n_ctx=256) as engine:
        d = engine.drafters[0]   # the drafter's sequence 0
        assert d.name == "dspark" and d.max_depth == BLOCK_SIZE and d.confidence_head
        engine.ctx.decode(tokens, 0, all_logits=False)
        d.begin(tokens, 0)
        d.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)
        drafts, confidence = d.draft_block(BLOCK_SIZE)
        assert len(drafts) == BLOCK_SIZE and drafts[0] == tokens[-1], drafts
        assert all(0.0 < p < 1.0 for p in confidence) and len(set(confidence)) > 1, confidence


def test_dflash_drafts_depend_on_the_injected_target_features(df):
    """The random drafter's block after the same anchor differs when the injected context
    differs (another prompt of the same length), and is the same when it is the same."""
    out = []
    with Engine(df["noisy"], df["dflash_random"], n_ctx=256) as engine:
        d = engine.drafters[0]   # the drafter's sequence 0
        for prompt in ("one two three four five six seven", "alpha beta gamma delta epsilon zeta eta",
                       "one two three four five six seven"):
            tokens = engine.model.tokenize(prompt)[:6] + [engine.model.tokenize(" fox")[-1]]
            engine.ctx.seq_rm(0)
            engine.ctx.decode(tokens, 0, all_logits=False)
            d.begin(tokens, 0)
            d.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)
            out.append(d.draft_block(BLOCK_SIZE - 1))
    assert out[0] == out[2] and out[0][0] != out[1][0], out


@pytest.mark.parametrize("drafter,policy,threads", [
    ("dflash", PolicyConfig("fixed", 4, tree="off"), 1), ("dflash", PolicyConfig("auto"), 1),
    ("dflash", PolicyConfig("fixed", 6, tree="off"), 2), ("dspark", PolicyConfig("fixed", 4, tree="off"), 1),
    ("dspark", PolicyConfig("auto"), 2), ("dspark_noconf", PolicyConfig("fixed", 8, tree="off"), 1),
    ("dflash_random", PolicyConfig("fixed", 4, tree="off"), 1), ("dspark_random", PolicyConfig("fixed", 4, tree="off"), 2),
], ids=["dflash-fixed4", "dflash-auto", "dflash-fixed6-2threads", "dspark-fixed4", "dspark-auto-2threads",
        "dspark-noconf-fixed8", "dflash-random", "dspark-random-2threads"])
def test_dflash_and_dspark_greedy_output_equals_plain_decoding(df, drafter, policy, threads):
    with Engine(df["noisy"], df[drafter], n_ctx=512, n_threads=threads) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=48, spec=False, record_margins=True))
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=policy))
    assert_lossless(plain, spec)
    if policy.name == "fixed":
        source = "dspark" if drafter.startswith("dspark") else "dflash"
        drafts, drafted, accepted = spec.stats.sources[source]
        assert drafted > 0, spec.stats.sources
        if "random" not in drafter:
            assert 0 < accepted < drafted, spec.stats.sources


def test_dflash_drafts_in_every_slot_of_a_parallel_engine(df):
    from engine_checks import assert_slots_lossless

    cfg = GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 4, tree="off", source="dflash"))
    assert_slots_lossless(df["noisy"], df["dflash"], [PROMPT, "One, two, three, four, five, six"], cfg, "dflash")


def test_dspark_sampled_output_follows_the_target_s_distribution(df):
    with Engine(df["noisy"], df["dspark"], n_ctx=256) as engine:
        assert_drafts_keep_the_distribution(engine, dict(temperature=0.6, top_k=8, top_p=1.0, min_p=0.0))


def test_dflash_auto_leaves_a_garbage_block_drafter_off_and_drafts_good_blocks(df, tmp_path, monkeypatch):
    """Under auto: with the cost model calibrated on this machine, a drafter whose blocks are never
    accepted is left off (a block of 8 full-vocabulary rows costs 3-4 target steps of the tiny
    target on this CPU, DSpark's 8-10: no acceptance could pay for it, so it is not even probed;
    bench/block_drafters.py times it against plain decoding); on a machine where a verify's and a
    block's rows are nearly free (a GPU-like calibration), a drafter whose drafts are good drafts
    several tokens per block, one drafter decode each (tests/test_block_auto.py: on a target costlier
    than a block, calibrated here)."""
    from localspec.speculation.cost_cache import write_entry

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    prompt = PROMPT + " " + PROMPT
    with Engine(df["noisy"], df["dflash_random"], n_ctx=512, n_threads=1) as engine:
        engine.cost_model()
        spec = _done(engine, prompt, GenerationConfig(max_tokens=96, policy=PolicyConfig("auto")))
    cycles, drafted, accepted = spec.stats.sources.get("dflash", [0, 0, 0])
    assert accepted == 0 and cycles <= 2, (spec.stats.sources, spec.stats.policy_choices)
    with Engine(df["noisy"], df["dspark"], n_ctx=512, n_threads=1) as engine:
        flat = {str(b): 0.01 * (1 + b / 64) for b in (1, 2, 4, 8, 16, 32, 64)}   # rows nearly free
        write_entry(tmp_path / "calibration.json", engine.cost_key(),
                    {"verify": flat, "drafter_step": 0.004, "drafter_width": None})
        engine.cost = None
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=64, policy=PolicyConfig("auto", source="dspark")))
    cycles, drafted, accepted = spec.stats.sources["dspark"]
    assert cycles > 4 and drafted > 2 * cycles and accepted > cycles, spec.stats.sources


def _reference_block(drafter_path, target_path, feats: np.ndarray, block: list[int], pos0: int, neox: bool,
                     hidden: bool = False):
    """The logits of a DFlash block, computed in numpy from the dflash graph of the pinned
    llama.cpp (src/models/dflash.cpp): the injected context's K/V from ``fc`` over the target
    features at positions 0..len-1, the block attending to it and to itself (non-causal), the
    target's tied embeddings as input and lm_head."""
    from localspec.llama.gguf_native import GGUFHeader

    d, t = GGUFHeader(drafter_path), GGUFHeader(target_path)
    w = {name: d.tensor_data(name).astype(np.float64) for name in d.tensors}
    embd = t.tensor_data("token_embd.weight").astype(np.float64)
    eps, n_head, hd = 1e-6, 4, 16

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x, pos):   # x: (rows, heads, hd)
        half = hd // 2
        inv = 10000.0 ** (-np.arange(half) * 2.0 / hd)
        ang = pos[:, None, None] * inv[None, None, :]
        a, b = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
        ra, rb = a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)
        return np.concatenate([ra, rb], -1) if neox else np.stack([ra, rb], -1).reshape(x.shape)

    g = rms(feats.astype(np.float64) @ w["fc.weight"].T, w["enc.output_norm.weight"])
    ctx_pos, blk_pos = np.arange(len(feats), dtype=np.float64), pos0 + np.arange(len(block), dtype=np.float64)
    x = embd[block]
    for i in range(2):
        p = f"blk.{i}."
        kc = rope(rms((g @ w[p + "attn_k.weight"].T).reshape(-1, n_head, hd), w[p + "attn_k_norm.weight"]), ctx_pos)
        vc = (g @ w[p + "attn_v.weight"].T).reshape(-1, n_head, hd)
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope(rms((h @ w[p + "attn_q.weight"].T).reshape(-1, n_head, hd), w[p + "attn_q_norm.weight"]), blk_pos)
        k = rope(rms((h @ w[p + "attn_k.weight"].T).reshape(-1, n_head, hd), w[p + "attn_k_norm.weight"]), blk_pos)
        v = (h @ w[p + "attn_v.weight"].T).reshape(-1, n_head, hd)
        keys, values = np.concatenate([kc, k]), np.concatenate([vc, v])
        scores = np.einsum("qhd,khd->hqk", q, keys) / np.sqrt(hd)
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", att, values).reshape(len(block), -1)
        x = x + out @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    h = rms(x, w["output_norm.weight"])
    return (h @ embd.T, h, w) if hidden else h @ embd.T

def _prompt_observed(engine):
    """(drafter, prompt tokens, the target's layer inputs 1 and 3 for them, whether the drafter's
    rope is NeoX) after the target decoded the prompt and the drafter observed it."""
    import llama_cpp

    from localspec.llama import llama_ext

    d = engine.drafters[0]   # the drafter's sequence 0
    tokens = engine.model.tokenize(PROMPT)
    engine.ctx.seq_rm(0)
    engine.ctx.decode(tokens, 0, all_logits=False)
    feats = np.concatenate([np.array(np.ctypeslib.as_array(llama_ext.get_embeddings_layer_inp(engine.ctx.ptr, lid),
                                                           shape=(len(tokens), 64))) for lid in (1, 3)], axis=1)
    neox = llama_cpp.llama_model_rope_type(d.drafter.model.ptr) == llama_cpp.LLAMA_ROPE_TYPE_NEOX
    d.begin(tokens, 0)
    d.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)
    return d, tokens, feats, neox



def test_dflash_blocks_are_the_dflash_graph_s_over_the_injected_features(df):
    """The random drafter's block logits, read by localspec after its injection of the target's
    layer inputs, equal a numpy computation of llama.cpp's dflash graph from the target features
    at their positions (so the right layers, in order, at the right positions); with the
    features of the wrong positions (rolled by one) they do not."""
    with Engine(df["noisy"], df["dflash_random"], n_ctx=256) as engine:
        d, tokens, feats, neox = _prompt_observed(engine)
        d.catch_up()
        block = [tokens[-1]] + [MASK_TOKEN] * 4
        d.kind.decode_block(d.drafter, tokens[-1], len(tokens), 4, d)
        got = np.stack([np.array(d.ctx.logits(i)) for i in range(len(block))])
        d.ctx.seq_rm(len(tokens))
    want = _reference_block(df["dflash_random"], df["noisy"], feats, block, len(tokens), neox)
    assert np.abs(got - want).max() < 2e-3 * np.abs(want).max(), np.abs(got - want).max()
    assert (got.argmax(1) == want.argmax(1)).all()
    wrong = _reference_block(df["dflash_random"], df["noisy"], np.roll(feats, 1, axis=0), block, len(tokens), neox)
    assert np.abs(got - wrong).max() > 10 * np.abs(got - want).max()


def test_fit_counts_a_dflash_drafter_s_weights_kv_and_a_block_sized_buffer_and_llama_cpp_allocates_them(df):
    """``fit``: the drafter's weights, its F32 KV over its 2 layers, a compute buffer and logit rows
    for one block (9 rows), a note that says so; and llama.cpp allocates what was planned (the KV
    exactly, the compute buffer within the plan)."""
    from localspec.memory.live import memory_report
    from localspec.memory.pair import plan_engine
    from localspec.store.models import ModelSpec

    info = read_gguf(df["dspark"])
    proc = run_cli("fit", "--target", str(df["noisy"]), "--draft", str(df["dspark"]), "--ctx", "256", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    drafter = out["drafter"]
    assert drafter["weights_bytes"] == sum(t.n_bytes for t in info.tensors.values()), drafter
    assert drafter["kv_type"] == "f32" and drafter["kv_bytes"] == 256 * 2 * (2 * 64) * 4, drafter
    assert drafter["output_bytes"] < 10 * info.n_vocab * 4 + (1 << 20), drafter   # one block's logit rows
    assert any("sized to its block of 9 rows" in note for note in out["notes"]), out["notes"]
    options = plan_engine(ModelSpec("t", df["noisy"], df["dspark"]), n_ctx=256, n_threads=1, ram=1 << 40)
    with Engine(df["noisy"], df["dspark"], n_threads=1, **options) as engine:
        report = memory_report(engine)
    actual, planned = report["actual"]["drafter"], report["planned"]["drafter"]
    assert abs(actual["kv_bytes"] - planned["kv_bytes"]) <= 6000, report
    # the plan's compute figure is llama.cpp's own reserve of the same context (an upper bound of the live one)
    assert actual["compute_bytes"] <= planned["compute_bytes"] <= 2.5 * actual["compute_bytes"], report


def test_list_and_show_name_a_dspark_drafter(df, isolated_home, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {df['noisy']}\nDRAFT {df['dspark']}\n")
    assert run_cli("create", "spark", "-f", str(tmp_path / "Modelfile")).returncode == 0
    listed = run_cli("list")
    assert listed.returncode == 0 and "dspark block" in listed.stdout, listed.stdout
    shown = run_cli("show", "spark")
    assert shown.returncode == 0 and "(dspark block drafter)" in " ".join(shown.stdout.split()), shown.stdout


def test_a_server_with_a_dspark_drafter_drafts_with_it_and_names_it(df, tmp_path):
    """``serve --draft`` the DSpark drafter: the official client's answer is plain decoding's
    text, usage counts the drafts under source ``dspark``, and so does ``/metrics``; Ollama's
    ``/api/show`` lists the source."""
    from serve_checks import running_server

    with Engine(df["noisy"], df["dspark"], n_ctx=256) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=24, spec=False))
    args = ("--target", str(df["noisy"]), "--draft", str(df["dspark"]), "--ctx", "256", "--parallel", "1",
            "--policy", "fixed", "--draft-max", "4", "--tree", "off")
    with running_server(tmp_path, *args) as srv:
        reply = srv.client().completions.create(model=df["noisy"].stem, prompt=PROMPT, max_tokens=24,
                                                temperature=0, extra_body={"repeat_penalty": 1.0})
        speculative = reply.usage.model_extra["speculative"]
        metrics = srv.metrics()
        shown = srv.http.post("/api/show", json={"model": df["noisy"].stem}).json()["draft"]
    assert reply.choices[0].text == plain.text
    assert shown["sources"] == ["dspark", "lookup"] and shown["drafter"]["variant"] == "dspark", shown
    assert speculative["sources"]["dspark"]["drafted"] > 0, speculative
    drafted = [v for (name, labels), v in metrics.items()
               if name.endswith("draft_tokens_by_source_total") and ("source", "dspark") in labels]
    assert drafted and drafted[0] > 0, sorted(k for k in metrics if "source" in str(k))


def test_dspark_blocks_chain_the_markov_head_and_read_the_confidence_head(df):
    """The random DSpark drafter (anchor-first block): each draft is the argmax of the dflash
    graph's logits plus the Markov bias of the previous draft (the anchor first), and each
    confidence is the sigmoid of conf_proj over [the row's final state, the previous token's
    Markov embedding]: localspec reads the drafts and the confidences at llama.cpp's rows."""
    n = 6
    with Engine(df["noisy"], df["dspark_random"], n_ctx=256) as engine:
        d, tokens, feats, neox = _prompt_observed(engine)
        drafts, confidence = d.draft_block(n)
    base, h, w = _reference_block(df["dspark_random"], df["noisy"], feats, [tokens[-1]] + [MASK_TOKEN] * (n - 1),
                                  len(tokens), neox, hidden=True)
    prev, want, conf = tokens[-1], [], []
    for i in range(n):
        markov = w["markov_w1.weight"][prev]
        conf.append(1 / (1 + np.exp(-(w["conf_proj.weight"].reshape(-1) @ np.concatenate([h[i], markov]) + w["conf_proj.bias"].reshape(-1)[0]))))
        prev = int(np.argmax(base[i] + w["markov_w2.weight"] @ markov))
        want.append(prev)
    assert drafts == want, (drafts, want)
    assert np.allclose(confidence, conf, atol=2e-3), (confidence, conf)


def _sdist_gguf_py(tmp_path):
    """gguf-py of the pinned llama-cpp-python sdist (its DFLASH tensor map), unpacked from the
    test cache's sdist (fetched on first use)."""
    import tarfile
    from importlib.metadata import version

    from sdist_templates import sdist_archive

    pinned = version("llama-cpp-python")
    archive = sdist_archive()
    prefix = f"llama_cpp_python-{pinned}/vendor/llama.cpp/gguf-py/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tmp_path / "gguf-py", members=members, filter="data")
    return tmp_path / "gguf-py"


@pytest.mark.parametrize("layout,kind", [("zlab", "dflash"), ("deepseek", "dspark"), ("speculators", "dspark")])
def test_convert_writes_the_dflash_gguf_of_a_dflash_or_dspark_checkpoint(df, tmp_path, layout, kind):
    """``localspec convert`` of a tiny z-lab DFlash / DeepSeek DSpark checkpoint: every tensor under
    the name the pinned llama.cpp's gguf-py maps it to for MODEL_ARCH.DFLASH (where its sdist is
    cached), the converter's keys (target layers + 1, the block, DSpark's flags, the target's
    tokenizer and the mask token), a pair that drafts and decodes as plain decoding does."""
    ckpt = tiny_checkpoint(tmp_path / "ckpt", layout)
    out = tmp_path / f"{kind}.gguf"
    proc = run_cli("convert", str(ckpt), "--target", str(df["noisy"]), "-o", str(out), "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    info = read_gguf(out)
    assert info.block_kind == kind and info.target_layers == (1, 3) and info.mask_token == MASK_TOKEN
    assert info.tokenizer_sha256 == read_gguf(df["noisy"]).tokenizer_sha256
    meta = info.metadata
    assert meta["dflash.block_size"] == (7 if kind == "dspark" else 8)
    if kind == "dspark":   # the speculators format puts a bonus anchor first (sample_from_anchor false)
        assert meta["dflash.sample_from_anchor"] is (layout == "deepseek") and meta["dflash.has_confidence_head"] is True
        # a full-vocabulary DSpark reads the target's lm_head; a reduced one ships its own and d2t
        assert ("output.weight" in info.tensors) == ("d2t" in info.tensors) == (layout == "speculators")
    gguf_py = _sdist_gguf_py(tmp_path)
    if gguf_py is not None:
        from safetensors import safe_open

        with safe_open(str(ckpt / "model.safetensors"), "np") as f:
            names = [n for n in f.keys() if n not in ("d2t", "t2d") and (layout == "speculators" or "lm_head" not in n)]
        script = ("import json, sys, gguf; m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DFLASH, 2); "
                  "names = json.loads(sys.argv[1]); "
                  "print(json.dumps({n: m.get_name(n if n.startswith('model.') else 'model.' + n, "
                  "try_suffixes=('.weight', '.bias')) for n in names}))")
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-c", script, json.dumps(names)], capture_output=True, text=True,
                              env={"PYTHONPATH": str(gguf_py), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        upstream = json.loads(done.stdout)
        expected = set(upstream.values()) | ({"d2t"} if layout == "speculators" else set())
        assert expected == set(info.tensors), (upstream, sorted(info.tensors))
    with Engine(df["noisy"], out, n_ctx=256) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=16, spec=False, record_margins=True))
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=16, policy=PolicyConfig("fixed", 4, tree="off")))
    assert_lossless(plain, spec)
    assert spec.stats.sources[kind][1] > 0


def test_the_chat_drafts_with_a_dspark_drafter_and_names_it(df, isolated_home):
    """The terminal chat on the pair: F3's rows name the block drafter, and a reply drafts with it."""
    assert_chat_drafts_with(lambda: Engine(df["noisy"], df["dspark"], n_ctx=256, n_threads=1), "noisy.gguf",
                            draft_max=4, drafter_row="dspark.gguf: dspark block drafter, source dspark",
                            source="dspark")
