"""``localspec train`` on a tiny target: end to end, resume, bad inputs.

The tiny ``noisy`` target (tests/tiny_models.py, noise 0.006) mostly repeats its last token, so a
drafter trained on its greedy responses should clearly beat a random one within seconds. "No disk
space" is simulated by making ``shutil.disk_usage`` (through which localspec.train checks free space
before writing anything) report 1 MiB free.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from localspec.runtime.bench import BenchPrompt, run_bench  # noqa: E402
from localspec.runtime.engine import Engine, GenerationConfig  # noqa: E402
from localspec.core.errors import LocalspecError  # noqa: E402
from localspec.speculation.policy import PolicyConfig  # noqa: E402
from localspec.train import dataset as dataset_mod  # noqa: E402
from localspec.train.pipeline import TrainOptions, run  # noqa: E402
from localspec.train.prompts import load_prompts  # noqa: E402
from localspec.formats import gguf_consts as K  # noqa: E402

from tiny_models import build_drafter, build_target  # noqa: E402

HELD_OUT = [BenchPrompt("Tell me about the ocean and its waves.", "chat"),
            BenchPrompt("What is a good way to learn chess?", "chat"),
            BenchPrompt("Write a poem about autumn leaves.", "writing")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    target = build_target(d / "target.gguf", "noisy", noise=0.006)
    items = [json.loads(line) for line in load_prompts_lines()][:48]
    (d / "prompts.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    return d, target


def load_prompts_lines():
    from localspec.train.prompts import default_prompts_path

    return default_prompts_path().read_text().splitlines()


def _opts(d: Path, target: Path, out: Path, **kw) -> TrainOptions:
    base = dict(target=target, out=out, prompts=d / "prompts.jsonl", time_budget_s=120, gen_time_s=60, max_new=48,
                n_seq=8, draft_vocab=512, batch_tokens=2048, eval_every_s=1e9, threads=1, train_threads=1,
                log=lambda m: None)
    base.update(kw)
    return TrainOptions(**base)


def _tokens_per_cycle(target: Path, drafter: Path) -> float:
    with Engine(target, drafter, n_ctx=512, n_threads=1) as eng:
        cfg = GenerationConfig(max_tokens=48, policy=PolicyConfig(name="fixed", draft_max=4))
        report = run_bench(eng, HELD_OUT, cfg).to_dict()
    assert report["greedy_identical"]
    return report["tokens_per_cycle"]


@pytest.mark.slow
def test_tiny_training_beats_random_drafter(tiny):
    d, target = tiny
    out = d / "trained.gguf"
    summary = run(_opts(d, target, out, max_steps=60, work_dir=d / "work-e2e", save_data=d / "data.jsonl.gz"))
    assert out.is_file() and summary.steps == 60 and summary.response_tokens > 500
    assert (d / "data.jsonl.gz").is_file()
    with gzip.open(d / "data.jsonl.gz", "rt") as fh:
        assert all("response" in json.loads(line) for line in fh)
    random_drafter = build_drafter(d / "random.gguf", target, "random", variant=K.VARIANT_EAGLE31)
    trained_tpc = _tokens_per_cycle(target, out)
    random_tpc = _tokens_per_cycle(target, random_drafter)
    assert trained_tpc > random_tpc + 0.5, (trained_tpc, random_tpc)
    # the in-training estimate, on the bench prompts' own responses, is what the runtime measures
    estimate = _torch_estimate(target, d / "work-e2e")
    assert abs(estimate - trained_tpc) < 0.25, (estimate, trained_tpc)
    # the same token ids reproduce a drafter without generating again
    again = run(_opts(d, target, d / "again.gguf", data=d / "data.jsonl.gz", prompts=None, max_steps=5,
                      work_dir=d / "work-data"))
    assert again.sequences == summary.sequences and (d / "again.gguf").is_file()


def _torch_estimate(target: Path, work: Path) -> float:
    """trainer.evaluate's tokens per cycle for the drafter in ``work/best.pt`` on the greedy
    responses to HELD_OUT, made by the target through llama.cpp (as the bench makes them)."""
    import numpy as np
    import torch

    from localspec.converters.reference import EagleReference
    from localspec.formats.gguf_info import read_gguf
    from localspec.llama.llama_model import Model
    from localspec.train.datagen import GenRequest, generate_batched
    from localspec.train.features import default_layers, extract_all, token_embeddings
    from localspec.train.pipeline import drafter_config
    from localspec.train.trainer import TrainConfig, TTTModel, evaluate
    from localspec.train.vocab import mappings

    info = read_gguf(target)
    with Engine(target, None, n_ctx=512, n_threads=1) as eng:
        prompts = [eng.prompt_tokens([{"role": "user", "content": p.prompt}]) for p in HELD_OUT]
    model = Model(target)
    try:
        res = {r.key: r for r in generate_batched(model, [GenRequest(str(i), t) for i, t in enumerate(prompts)],
                                                  n_seq=4, max_new=48, n_threads=1)}
        layers = default_layers(info.n_layer)
        feats = extract_all(model, layers, [(res[str(i)].prompt + res[str(i)].response, len(res[str(i)].prompt))
                                            for i in range(len(prompts))], top_k=16, max_len=512, n_threads=1)
    finally:
        model.close()
    ids = np.load(work / "vocab.npy")
    ref = EagleReference(drafter_config(info, layers), draft_vocab=len(ids))
    ref.load_state_dict(torch.load(work / "best.pt", weights_only=False))
    return evaluate(TTTModel(ref, torch.from_numpy(token_embeddings(target))), feats, mappings(ids, info.n_vocab)[2],
                    TrainConfig())["tau"]


def test_walked_estimate_counts_cycles_as_the_runtime_does():
    import torch

    from localspec.train.trainer import chain_tau, walk_tau

    # rows 1..8 hold response tokens (row 0: the prompt's last row predicts the first response token)
    valid = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    step0 = torch.ones(1, 10, dtype=torch.bool)
    step0[0, 3] = False          # a chain whose first draft sits at row 3 fails at once
    step1 = torch.ones(1, 10, dtype=torch.bool)
    never = torch.zeros(1, 10, dtype=torch.bool)
    # cycles start at rows 2, 5 and 8: accepted 2, 2 and 1 (the response ends) -> 8 tokens in 3 cycles;
    # row 3, the one hard start, is stepped over as the runtime steps over it
    assert walk_tau([step0, step1, never, never], valid, 4) == (8.0, 3.0)
    # counting every row as a cycle start counts it once, like the easy rows: 7 starts accept 2, row 3 none
    accepted, starts = chain_tau([step0, step1, never, never], valid, 4)
    assert (accepted, starts) == (14.0, 8.0)


@pytest.mark.slow
def test_resume_after_interruption(tiny, monkeypatch):
    d, target = tiny
    work = d / "work-resume"
    out = d / "resumed.gguf"
    logs: list[str] = []
    # interrupted (Ctrl-C) while generating: part of the prompts answered, no drafter yet
    def interrupt(e):
        if e.get("event") == "gen" and e["done"] >= 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(_opts(d, target, out, work_dir=work, progress=interrupt))
    assert not out.exists()
    n_first = len((work / "sequences.jsonl").read_text().splitlines())
    assert n_first > 0
    with open(work / "sequences.jsonl", "a") as fh:   # a torn line, as a kill mid-write leaves
        fh.write('{"key": "abc", "prom')
    with pytest.raises(LocalspecError, match="--resume"):
        run(_opts(d, target, out, work_dir=work))
    summary = run(_opts(d, target, out, work_dir=work, resume=True, max_steps=25, log=logs.append))
    assert any("done)" in m and f"({n_first} done)" in m for m in logs), logs
    assert out.is_file() and summary.sequences > n_first
    # training goes on from the checkpoint, and the features come from the cache, not a new prefill
    assert (work / "features.npz").is_file()
    from localspec.train import features as features_mod

    def no_prefill(*a, **k):
        raise AssertionError("features recomputed on resume")

    monkeypatch.setattr(features_mod, "extract_all", no_prefill)
    summary2 = run(_opts(d, target, out, work_dir=work, resume=True, max_steps=30, log=logs.append))
    assert any("resuming training at step 25" in m for m in logs), logs
    assert summary2.steps == 30


@pytest.mark.slow
def test_resume_with_more_prompts_prefills_only_the_new_sequences(tiny, monkeypatch):
    d, target = tiny
    work = d / "work-grow"
    items = [json.loads(line) for line in load_prompts_lines()][:48]
    first = d / "first.jsonl"
    first.write_text("".join(json.dumps(i) + "\n" for i in items[:20]))
    run(_opts(d, target, d / "grow.gguf", prompts=first, work_dir=work, max_steps=3))
    n_first = sum(bool(json.loads(line)["response"]) for line in (work / "sequences.jsonl").read_text().splitlines())
    from localspec.train import features as features_mod

    real = features_mod.extract_all
    prefilled: list[int] = []

    def counting(model, layers, seqs, **kw):
        prefilled.append(len(seqs))
        return real(model, layers, seqs, **kw)

    monkeypatch.setattr(features_mod, "extract_all", counting)
    more = d / "more.jsonl"
    more.write_text("".join(json.dumps(i) + "\n" for i in items[:32]))
    summary = run(_opts(d, target, d / "grow.gguf", prompts=more, work_dir=work, resume=True, max_steps=6))
    assert summary.sequences > n_first and prefilled == [summary.sequences - n_first]
    # the held-out set changed with the data, so the best drafter is chosen afresh on it
    import torch

    state = torch.load(work / "checkpoint.pt", weights_only=False)["state"]
    assert len(state["history"]) == 2 and state["best_tau"] == state["history"][-1]["tau"]


def test_held_out_split_keeps_whole_groups_out(tmp_path):
    from localspec.train.dataset import Sequence, load_sequences, write_compressed
    from localspec.train.pipeline import is_held_out

    seqs = [Sequence(f"{i:016x}", "chat", [1, 2], [3 + i], group=f"chat:topic {i // 5}") for i in range(2000)]
    by_group: dict[str, set] = {}
    for s in seqs:
        by_group.setdefault(s.group, set()).add(is_held_out(s))
    assert all(len(v) == 1 for v in by_group.values())   # a topic is never split
    held = sum(v == {True} for v in by_group.values())
    assert 0.02 < held / len(by_group) < 0.1
    # the group survives the dataset file; a sequence without one is split by its own key
    path = write_compressed(seqs[:3] + [Sequence("ffff000000000000", "x", [1], [2])], tmp_path / "d.jsonl.gz")
    back = load_sequences(path)
    assert [s.group for s in back] == ["chat:topic 0"] * 3 + [""]
    assert is_held_out(back[3]) == (int("ffff0000", 16) % 20 == 0)


def test_unsupported_architecture(tmp_path):
    target = build_target(tmp_path / "qwen2.gguf", "noisy", arch="qwen2")
    with pytest.raises(LocalspecError, match="qwen2.*cannot export layer features"):
        run(TrainOptions(target=target, out=tmp_path / "d.gguf", log=lambda m: None))
    assert not (tmp_path / "d.gguf").exists()


def test_empty_prompt_file(tiny, tmp_path):
    _, target = tiny
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(LocalspecError, match="no prompts"):
        run(TrainOptions(target=target, out=tmp_path / "d.gguf", prompts=empty, log=lambda m: None))
    assert list(tmp_path.iterdir()) == [empty]


def test_no_disk_space(tiny, tmp_path, monkeypatch):
    _, target = tiny
    real = shutil.disk_usage

    def tiny_fs(path):
        usage = real(path)
        return usage._replace(free=1 << 20)

    monkeypatch.setattr(dataset_mod.shutil, "disk_usage", tiny_fs)
    with pytest.raises(LocalspecError, match="not enough disk space"):
        run(TrainOptions(target=target, out=tmp_path / "d.gguf", log=lambda m: None))
    assert not (tmp_path / "d.gguf").exists()


def test_cli_bad_input_is_one_line(tiny, tmp_path, capsys):
    from localspec.cli import main

    _, target = tiny
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    rc = main(["train", "--target", str(target), "-o", str(tmp_path / "d.gguf"), "--prompts", str(empty), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("Error: ") and "no prompts" in err and "Traceback" not in err
    rc = main(["train", "--target", str(target), "-o", str(tmp_path / "d.gguf"), "--time-budget", "soon", "--quiet"])
    assert rc == 1 and "not a duration" in capsys.readouterr().err


def test_prompt_file_formats(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "hi", "category": "chat"}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                            {"role": "user", "content": "c"}]}) + "\n")
    items = load_prompts(p)
    assert [len(i.messages) for i in items] == [1, 3] and items[0].category == "chat"
    assert [i.group for i in items] == ["", ""]
    p.write_text(json.dumps({"prompt": "hi", "group": "greetings"}) + "\n")
    assert load_prompts(p)[0].group == "greetings"
    assert len(load_prompts(None)) >= 500


def test_default_prompt_set_is_promptgen_output_and_disjoint_from_the_held_out_bench():
    from localspec.train import promptgen

    root = Path(__file__).resolve().parents[1]
    shipped = [json.loads(line) for line in (root / "localspec" / "data" / "train_prompts.jsonl").read_text().splitlines()]
    assert shipped == promptgen.default_set() and len(shipped) > 2000
    assert {p.category for p in load_prompts(None)} >= {"chat", "coding", "math", "writing", "multi-turn"}
    held = {json.loads(line)["prompt"] for line in (root / "bench" / "heldout.jsonl").read_text().splitlines() if line}
    assert not held & {m["content"] for it in shipped for m in it["messages"]}
    # every prompt names its topic, and topics hold several prompts (the held-out split goes by topic)
    groups = [it["group"] for it in shipped]
    assert all(groups) and len(set(groups)) < len(groups) / 3
    assert sum(it["category"] == "chat" for it in shipped) > 1000


def test_datagen_throughput_bench_reports_batched_against_single_stream(tiny):
    import subprocess
    import sys

    _, target = tiny
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "datagen_throughput.py"), "--target", str(target),
                           "--parallel", "1,4", "--prompts", "8", "--max-new", "8", "--threads", "1",
                           "--prefill-seconds", "0.5", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["tok_s"]) == {"1", "4"} and all(v > 0 for v in report["tok_s"].values())
    assert report["prefill_tok_s"] > 0 and report["speedup"]["1"] == 1.0
    assert report["ceiling_speedup"] == report["prefill_tok_s"] / report["tok_s"]["1"]
