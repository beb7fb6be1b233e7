"""The shipped catalog (every entry parses, both copies agree, CHECKED marks) and `pull` taking a
catalog's files under other names, against the local Hugging Face stand-in of test_pull.py extended
with the Hub's file listing (``GET /api/models/{repo}/tree/{revision}``, what huggingface_hub's
``list_repo_files`` calls). No part of huggingface_hub is mocked.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from localspec.store import hub, install, registry, repo_files
from localspec.cli import main
from localspec.core.errors import LocalspecError
from localspec.store.models import resolve
from hub_stub import COMMIT, FakeHub, _handler  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    import tiny_models

    d = tmp_path_factory.mktemp("tiny_pair_catalog")
    target = tiny_models.build_target(d / "tiny-target.gguf")
    drafter = tiny_models.build_drafter(d / "tiny-drafter.gguf", target)
    return target.read_bytes(), drafter.read_bytes()


def _catalog(text: str) -> None:
    registry.user_catalog_path().write_text("schema = 1\n" + text, encoding="utf-8")


def _entry(name: str, target_file: str, extra_target: str = "") -> str:
    return (f'[models.{name}]\ndescription = "renamed files"\n'
            f'[models.{name}.target]\nrepo = "test/tiny-GGUF"\nfile = "{target_file}"\n{extra_target}'
            f'[models.{name}.draft]\nrepo = "test/tiny-eagle3"\nfile = "tiny-drafter.gguf"\n')


def _downloads(fake: FakeHub) -> list[str]:
    return [p.split("/resolve/")[1].split("/", 1)[1] for m, p, _ in fake.log if m == "GET" and "/resolve/" in p]


# --------------------------------------------------------------------------------------------
# the shipped catalog


def test_every_catalog_entry_parses_and_says_what_was_checked():
    text = registry.shipped_catalog_text()
    cat = registry.parse_catalog(text, "localspec/data/models.toml").models
    assert len(cat) >= 15
    for name, e in cat.items():
        assert e.checked in ("yes", "partly", "no"), name
        if e.embedded:
            continue
        assert e.target.file.endswith(".gguf") and (e.draft is not None) != (e.source == "mtp"), name
        if e.checked != "no":
            assert e.sources, f"{name}: verified without a source"
        if e.draft is not None and e.draft.files is not None:
            weights = [f for f in e.draft.files if f != "config.json"]
            assert weights and all(f.endswith((".safetensors", ".bin")) for f in weights), name
        # a revision pinned in the catalog is a full commit hash (what a source quoted), never a branch
        for rev in (e.target.revision, e.draft.revision if e.draft else None):
            assert rev is None or re.fullmatch(r"[0-9a-f]{40}", rev), name
    # the pairs the issue asked for
    repos = {e.draft.repo for e in cat.values() if e.draft}
    assert {"RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "RedHatAI/Qwen3-8B-speculator.eagle3",
            "yuhuili/EAGLE3-DeepSeek-R1-Distill-LLaMA-8B"} <= repos
    assert cat["gemma4-26b-a4b"].target.file == "gemma-4-26B-A4B-it-UD-Q4_K_M.gguf"
    assert cat["qwen3-4b"].draft.files == ["config.json", "model.safetensors"]
    # pairs that need no drafter file: the target's own MTP heads, each with its sources
    mtp = {name: e for name, e in cat.items() if e.source == "mtp"}
    assert mtp and all(e.sources and e.checked != "no" and e.draft is None for e in mtp.values()), mtp
    assert cat["glm-4.7-flash-mtp"].target.file == "GLM-4.7-Flash-MTP-default-Q8_0.gguf"


def test_both_models_toml_copies_are_identical():
    assert (ROOT / "models.toml").read_bytes() == (ROOT / "localspec" / "data" / "models.toml").read_bytes()


def test_list_catalog_shows_the_checked_column(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["list", "--catalog"]) == 0
    out = capsys.readouterr().out
    assert "CHECKED" in out
    cat = registry.load_catalog()
    for name, e in cat.items():
        row = next(line for line in out.splitlines() if f" {name} " in line)
        assert f" {e.checked} " in row, (name, row)
    assert {e.checked for e in cat.values()} >= {"yes", "partly"}
    for name, e in cat.items():   # pairs without a drafter file name their source
        if e.source == "mtp":
            row = next(line for line in out.splitlines() if f" {name} " in line)
            assert "mtp (the target's own heads)" in row, row


# --------------------------------------------------------------------------------------------
# the rules, on listings quoted from the Hub's history


@pytest.mark.parametrize("wanted, parts, listing, expect", [
    # gpt-oss: lower-case single file renamed to upper case
    ("gpt-oss-20b-mxfp4.gguf", [], ["gpt-oss-20b-MXFP4.gguf", "README.md"], ["gpt-oss-20b-MXFP4.gguf"]),
    # split into three shards before, two (upper case) now
    ("gpt-oss-120b-mxfp4-00001-of-00003.gguf",
     ["gpt-oss-120b-mxfp4-00002-of-00003.gguf", "gpt-oss-120b-mxfp4-00003-of-00003.gguf"],
     ["gpt-oss-120b-MXFP4-00001-of-00002.gguf", "gpt-oss-120b-MXFP4-00002-of-00002.gguf"],
     ["gpt-oss-120b-MXFP4-00001-of-00002.gguf", "gpt-oss-120b-MXFP4-00002-of-00002.gguf"]),
    # split before, one file now; and a single file preferred to a split set of the same quant
    ("gpt-oss-120b-mxfp4-00001-of-00003.gguf", [], ["gpt-oss-120b-mxfp4.gguf"], ["gpt-oss-120b-mxfp4.gguf"]),
    ("m-Q4_K_M.gguf", [], ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "M-Q4_K_M.GGUF"],
     ["M-Q4_K_M.GGUF"]),
    ("x-Q4_K_M.gguf", [], ["Q4_K_M/x-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/x-Q4_K_M-00002-of-00002.gguf",
                          "x-Q8_0.gguf"],
     ["Q4_K_M/x-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/x-Q4_K_M-00002-of-00002.gguf"]),
    # unsloth's dynamic quant stands for the plain tag only when the plain one is absent
    ("gemma-4-26B-A4B-it-Q4_K_M.gguf", [],
     ["gemma-4-26B-A4B-it-UD-Q4_K_M.gguf", "gemma-4-26B-A4B-it-Q8_0.gguf", "mmproj-F16.gguf"],
     ["gemma-4-26B-A4B-it-UD-Q4_K_M.gguf"]),
    ("g-Q4_K_M.gguf", [], ["g-UD-Q4_K_M.gguf", "g-Q4_K_M-new.gguf"], ["g-Q4_K_M-new.gguf"]),
    # a renamed model stem with the same quant
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", [], ["Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Llama-3.1-8B-Instruct-Q8_0.gguf"],
     ["Llama-3.1-8B-Instruct-Q4_K_M.gguf"]),
])
def test_gguf_rules(wanted, parts, listing, expect):
    got = repo_files.resolve_gguf("o/r", wanted, parts, listing)
    assert list(got.files) == expect


@pytest.mark.parametrize("listing, message", [
    (["a-Q4_K_M.gguf", "b-Q4_K_M.gguf"], "several Q4_K_M files match: a-Q4_K_M.gguf, b-Q4_K_M.gguf"),
    (["c-Q8_0.gguf", "c-F16.gguf"], r"no Q4_K_M file either \(tags there: F16, Q8_0\)"),
    (["c-Q4_K_M-00001-of-00003.gguf", "c-Q4_K_M-00003-of-00003.gguf"], "split GGUF is incomplete"),
    (["Q4_K_M/c-Q4_K_M.gguf", "other/c-Q4_K_M.gguf"], "several Q4_K_M files match"),
])
def test_gguf_rules_refuse_when_ambiguous(listing, message):
    with pytest.raises(LocalspecError, match=message) as info:
        repo_files.resolve_gguf("o/r", "c-Q4_K_M.gguf", [], listing)
    assert "o/r: no file 'c-Q4_K_M.gguf'" in str(info.value) and "models.toml" in str(info.value)


@pytest.mark.parametrize("files, listing, expect", [
    (["config.json", "pytorch_model.bin"], ["config.json", "model.safetensors"], ["config.json", "model.safetensors"]),
    (["config.json", "model.safetensors"], ["config.json", "pytorch_model.bin", "training_args.bin"],
     ["config.json", "pytorch_model.bin"]),
    (["config.json", "model.safetensors"], ["Config.json", "Model.safetensors"], ["Config.json", "Model.safetensors"]),
    (["config.json", "model.safetensors"],
     ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
     ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
    (["config.json", "pytorch_model.bin"], ["config.json", "eagle3_head.safetensors", "README.md"],
     ["config.json", "eagle3_head.safetensors"]),
    # both formats present: safetensors first
    (["config.json", "weights.bin"], ["config.json", "pytorch_model.bin", "model.safetensors"],
     ["config.json", "model.safetensors"]),
])
def test_checkpoint_rules(files, listing, expect):
    assert list(repo_files.resolve_checkpoint("o/r", files, listing).files) == expect


def test_checkpoint_rules_refuse_when_ambiguous():
    with pytest.raises(LocalspecError, match="several weights files could stand for it: a.safetensors, b.bin"):
        repo_files.resolve_checkpoint("o/r", ["config.json", "model.safetensors"], ["config.json", "a.safetensors", "b.bin"])
    with pytest.raises(LocalspecError, match="no file 'config.json'"):
        repo_files.resolve_checkpoint("o/r", ["config.json", "model.safetensors"], ["model.safetensors"])
    with pytest.raises(LocalspecError, match="sharded weights are incomplete"):
        repo_files.resolve_checkpoint("o/r", ["config.json", "model.safetensors"],
                                      ["config.json", "model-00001-of-00003.safetensors"])


# --------------------------------------------------------------------------------------------
# pull against the endpoint stand-in


def test_pull_takes_a_renamed_target_and_says_so(listing_hub, tiny_pair, capsys):
    t_bytes, d_bytes = tiny_pair
    listing_hub.add("test/tiny-GGUF", "tiny-UD-Q4_K_M.gguf", t_bytes)
    listing_hub.add("test/tiny-GGUF", "tiny-Q8_0.gguf", b"not this one")
    listing_hub.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    _catalog(_entry("renamed", "tiny-Q4_K_M.gguf"))

    assert main(["pull", "renamed"]) == 0
    err = capsys.readouterr().err
    assert "note: test/tiny-GGUF has no 'tiny-Q4_K_M.gguf'; using 'tiny-UD-Q4_K_M.gguf'" in err
    assert "Q4_K_M" in err and "Traceback" not in err
    spec = resolve("renamed")
    assert spec.target.read_bytes() == t_bytes and spec.drafter.read_bytes() == d_bytes
    assert registry.load("renamed").origin["from"] == "hf.co/test/tiny-GGUF/tiny-UD-Q4_K_M.gguf"
    assert "tiny-Q8_0.gguf" not in _downloads(listing_hub)


def test_pull_takes_another_letter_case_and_alternatives(listing_hub, tiny_pair, capsys):
    t_bytes, d_bytes = tiny_pair
    listing_hub.add("test/tiny-GGUF", "tiny-MXFP4.gguf", t_bytes)
    listing_hub.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    _catalog(_entry("cased", "tiny-mxfp4.gguf"))
    record = install.pull("cased")
    assert Path(record.target).read_bytes() == t_bytes
    assert "another letter case" in capsys.readouterr().err

    # an entry's alternatives come before the rules (here the rules alone would be ambiguous)
    listing_hub.add("test/tiny-GGUF", "tiny-v2-MXFP4.gguf", t_bytes + b"")
    listing_hub.add("test/tiny-GGUF", "tiny-v3-MXFP4.gguf", b"x")
    _catalog(_entry("alt", "tiny-gone-mxfp4.gguf", 'alternatives = ["tiny-v2-MXFP4.gguf"]\n'))
    record = install.pull("alt")
    assert Path(record.target).name == "tiny-v2-MXFP4.gguf"
    assert "the catalog's alternative name 'tiny-v2-MXFP4.gguf'" in capsys.readouterr().err


def test_pull_takes_a_split_set_then_works_offline(listing_hub, tiny_pair, monkeypatch):
    t_bytes, _ = tiny_pair
    half = len(t_bytes) // 2
    listing_hub.add("test/tiny-GGUF", "tiny-Q8_0-00001-of-00002.gguf", t_bytes[:half])
    listing_hub.add("test/tiny-GGUF", "tiny-Q8_0-00002-of-00002.gguf", t_bytes[half:])
    path, name = hub.fetch_gguf("test/tiny-GGUF", "tiny-Q8_0.gguf")
    assert name == "tiny-Q8_0-00001-of-00002.gguf" and path.read_bytes() == t_bytes[:half]
    second = path.with_name("tiny-Q8_0-00002-of-00002.gguf")
    assert second.read_bytes() == t_bytes[half:]   # next to the first, where llama.cpp looks

    # offline, the cached snapshot's listing resolves the same name without the network
    import huggingface_hub.constants as hf_constants

    n = len(listing_hub.log)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    again, name2 = hub.fetch_gguf("test/tiny-GGUF", "tiny-Q8_0.gguf")
    assert (again, name2) == (path, name) and len(listing_hub.log) == n


def test_pull_ambiguous_names_fail_with_the_candidates(listing_hub, tiny_pair, capsys):
    t_bytes, d_bytes = tiny_pair
    listing_hub.add("test/tiny-GGUF", "a-Q4_K_M.gguf", t_bytes)
    listing_hub.add("test/tiny-GGUF", "b-Q4_K_M.gguf", t_bytes)
    listing_hub.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    _catalog(_entry("amb", "c-Q4_K_M.gguf"))
    assert main(["pull", "amb"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: test/tiny-GGUF: no file 'c-Q4_K_M.gguf'; several Q4_K_M files match: "
                          "a-Q4_K_M.gguf, b-Q4_K_M.gguf.")
    assert err.count("\n") == 1 and registry.load("amb") is None
    assert not [f for f in _downloads(listing_hub) if f.endswith("Q4_K_M.gguf") and not f.startswith("c-")]


def test_missing_file_without_any_candidate_keeps_the_original_error(listing_hub, tiny_pair):
    t_bytes, _ = tiny_pair
    listing_hub.add("test/tiny-GGUF", "readme.md", b"no gguf here")
    with pytest.raises(LocalspecError, match="no file 'tiny-Q4_K_M.gguf'; no Q4_K_M file either"):
        hub.fetch_gguf("test/tiny-GGUF", "tiny-Q4_K_M.gguf")
    with pytest.raises(LocalspecError, match="repository 'test/absent' not found"):
        hub.fetch_gguf("test/absent", "tiny-Q4_K_M.gguf")


def test_checkpoint_weights_under_another_name(listing_hub, capsys):
    cfg = b'{"architectures": ["LlamaForCausalLMEagle3"]}'
    cfg_sha = listing_hub.add("test/ckpt", "config.json", cfg)
    listing_hub.add("test/ckpt", "model.safetensors", b"weights")
    src = hub.fetch_checkpoint("test/ckpt", ["config.json", "pytorch_model.bin"],
                               digests={"config.json": cfg_sha, "pytorch_model.bin": "0" * 64})
    assert (src / "config.json").read_bytes() == cfg and (src / "model.safetensors").read_bytes() == b"weights"
    assert not (src / "pytorch_model.bin").exists()
    assert "pytorch_model.bin -> model.safetensors (the standard weights file model.safetensors)" in capsys.readouterr().err

    # a config checksum that does not match still fails: only renamed files skip their digest
    with pytest.raises(LocalspecError, match="checksum mismatch"):
        hub.fetch_checkpoint("test/ckpt", ["config.json", "pytorch_model.bin"], digests={"config.json": "1" * 64})


@pytest.mark.parametrize("entry, message", [
    ('[models.x.target]\nrepo = "a/b"\nfile = "f-Q4_K_M.gguf"\nalternatives = ["f.bin"]\n', "models.x.target.alternatives"),
    ('[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\n[models.x.draft]\nrepo = "a/d"\nfile = "d.gguf"\n'
     'alternatives = ["d.safetensors"]\n', "alternative 'd.safetensors' of a drafter .gguf is not a .gguf"),
    ('[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\n[models.x.draft]\nrepo = "a/d"\n'
     'files = ["config.json", "model.safetensors"]\nalternatives = ["weights.gguf"]\n', "is not a checkpoint file"),
    ('verified = 3\n[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\n', "models.x.verified"),
    ('source = "mtp"\n[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\n[models.x.draft]\nrepo = "a/d"\n'
     'file = "d.gguf"\n', "drafts with the target's own heads: give no [draft] table"),
    ('source = "eagle"\n[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\n', "models.x.source"),
])
def test_catalog_alternatives_and_notes_are_validated(entry, message):
    _catalog('[models.x]\ndescription = "d"\n' + entry)
    with pytest.raises(LocalspecError, match=re.escape(message)):
        registry.load_catalog()
