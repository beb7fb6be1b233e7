"""`localspec pull` against a local Hugging Face-compatible HTTP server on 127.0.0.1.

The server implements what huggingface_hub's ``hf_hub_download`` calls: HEAD and GET on
``/{repo}/resolve/{revision}/{file}`` with X-Repo-Commit, ETag and Content-Length, HTTP range
requests (206) for resumed downloads, and the Hub's X-Error-Code 404s. No part of huggingface_hub
is mocked; HF_ENDPOINT points it at the server and HF_HOME at a temporary cache.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from localspec.store import registry
from localspec.cli import main
from localspec.core.errors import LocalspecError
from localspec.store.hub import parse_hf_ref
from localspec.store.install import pull
from localspec.store.models import resolve
from hub_stub import COMMIT, FakeHub, _handler, serving


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    hub = FakeHub()
    with serving(_handler(hub), tmp_path, monkeypatch):
        yield hub


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    import tiny_models

    d = tmp_path_factory.mktemp("tiny_pair")
    target = tiny_models.build_target(d / "tiny-target.gguf")
    drafter = tiny_models.build_drafter(d / "tiny-drafter.gguf", target)
    return target.read_bytes(), drafter.read_bytes(), drafter


def _catalog(entries: str) -> None:
    registry.user_catalog_path().write_text("schema = 1\n" + entries, encoding="utf-8")


def _pair_entry(name="tiny", target_sha=None, draft_sha=None, revision=None) -> str:
    rev = f'revision = "{revision}"\n' if revision else ""
    return (f'[models.{name}]\ndescription = "tiny test pair"\n'
            f'[models.{name}.parameters]\ntemperature = 0.5\n'
            f'[models.{name}.target]\nrepo = "test/tiny-GGUF"\nfile = "tiny-target.gguf"\n{rev}'
            + (f'sha256 = "{target_sha}"\n' if target_sha else "")
            + f'[models.{name}.draft]\nrepo = "test/tiny-eagle3"\nfile = "tiny-drafter.gguf"\n'
            + (f'sha256 = "{draft_sha}"\n' if draft_sha else ""))


def test_pull_success_registers_pair_in_hf_cache(hub_server, tiny_pair, tmp_path, monkeypatch):
    t_bytes, d_bytes, _ = tiny_pair
    t_sha = hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    d_sha = hub_server.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    _catalog(_pair_entry(target_sha=t_sha, draft_sha=d_sha, revision=COMMIT))

    assert main(["pull", "tiny"]) == 0
    spec = resolve("tiny")
    hf_cache = tmp_path / "hf" / "hub"
    assert spec.target.read_bytes() == t_bytes and spec.drafter.read_bytes() == d_bytes
    assert hf_cache in spec.target.parents and hf_cache in spec.drafter.parents
    assert spec.parameters == {"temperature": 0.5}
    assert [m.name for m in registry.list_models()] == ["tiny"]
    assert all(h.startswith("/test/") for _, h, _ in hub_server.log)

    # Pulled once: the cache alone serves a second pull with the network switched off.
    n = len(hub_server.log)
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull("tiny") is not None
    assert len(hub_server.log) == n


def test_interrupted_download_is_resumed(hub_server, tiny_pair):
    t_bytes, d_bytes, _ = tiny_pair
    # huggingface_hub writes 10 MiB chunks: pad the target so a cut after 12 MiB keeps a chunk.
    big = t_bytes + bytes(16 << 20)
    t_sha = hub_server.add("test/tiny-GGUF", "tiny-target.gguf", big)
    hub_server.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    cut = 12 << 20
    hub_server.truncate_next[("test/tiny-GGUF", "tiny-target.gguf")] = cut
    _catalog(_pair_entry(target_sha=t_sha))

    record = pull("tiny")
    assert Path(record.target).read_bytes() == big
    gets = [r for m, p, r in hub_server.log if m == "GET" and p.endswith("tiny-target.gguf")]
    assert len(gets) == 2 and gets[0] is None
    m = re.fullmatch(r"bytes=(\d+)-", gets[1] or "")   # the second request resumed mid-file
    assert m and 0 < int(m.group(1)) <= cut


def test_checksum_mismatch_fails_and_leaves_nothing(hub_server, tiny_pair, tmp_path):
    t_bytes, d_bytes, _ = tiny_pair
    hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    hub_server.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    _catalog(_pair_entry(target_sha="0" * 64))

    with pytest.raises(LocalspecError, match=r"tiny-target.gguf: checksum mismatch \(expected sha256 0{64}"):
        pull("tiny")
    assert registry.load("tiny") is None
    blobs = list((tmp_path / "hf" / "hub").rglob("blobs/*"))
    assert not [b for b in blobs if b.is_file() and b.stat().st_size == len(t_bytes)]
    # and through the CLI: one line, exit 1
    assert main(["pull", "tiny"]) == 1


def test_offline_miss(hub_server, tiny_pair, monkeypatch, capsys):
    import huggingface_hub.constants as hf_constants

    t_bytes, d_bytes, _ = tiny_pair
    hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    _catalog(_pair_entry())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert main(["pull", "tiny"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: test/tiny-GGUF/tiny-target.gguf is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE" in err and "Traceback" not in err
    assert hub_server.log == []          # nothing went to the network
    assert registry.load("tiny") is None


def test_missing_repo_file_and_unknown_name(hub_server, tiny_pair):
    t_bytes, _, _ = tiny_pair
    hub_server.add("test/tiny-GGUF", "other.gguf", t_bytes)
    _catalog(_pair_entry() + '[models.norepo]\ndescription = "x"\n[models.norepo.target]\n'
             'repo = "test/absent"\nfile = "a.gguf"\n')
    with pytest.raises(LocalspecError, match="no file 'tiny-target.gguf' in test/tiny-GGUF"):
        pull("tiny")
    with pytest.raises(LocalspecError, match="repository 'test/absent' not found"):
        pull("norepo")
    with pytest.raises(LocalspecError, match="'nosuch' is not in the catalog"):
        pull("nosuch")
    with pytest.raises(LocalspecError, match="not downloaded: run `localspec pull norepo`"):
        resolve("norepo")


def test_pull_checkpoint_drafter_is_converted(hub_server, tiny_pair, monkeypatch):
    t_bytes, _, drafter_path = tiny_pair
    cfg, weights = b'{"architectures": ["LlamaForCausalLMEagle3"]}', b"not really weights"
    hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    cfg_sha = hub_server.add("test/ckpt", "config.json", cfg)
    hub_server.add("test/ckpt", "model.safetensors", weights)
    calls = []

    def convert_checkpoint(src, target_gguf, out_path, outtype="f16", force=False):
        calls.append((Path(src), Path(target_gguf), Path(out_path)))
        assert (Path(src) / "config.json").read_bytes() == cfg
        assert (Path(src) / "model.safetensors").read_bytes() == weights
        Path(out_path).write_bytes(drafter_path.read_bytes())

    fake = types.ModuleType("localspec.converters.convert")
    fake.convert_checkpoint = convert_checkpoint
    monkeypatch.setitem(sys.modules, "localspec.converters.convert", fake)
    _catalog('[models.ck]\ndescription = "checkpoint drafter"\n[models.ck.target]\n'
             'repo = "test/tiny-GGUF"\nfile = "tiny-target.gguf"\n'
             '[models.ck.draft]\nrepo = "test/ckpt"\nfiles = ["config.json", "model.safetensors"]\n'
             f'variant = "eagle3.1"\nsha256 = {{ "config.json" = "{cfg_sha}" }}\n')
    record = pull("ck")
    assert len(calls) == 1
    assert Path(record.drafter).parent == registry.drafters_dir()
    assert Path(record.drafter).read_bytes() == drafter_path.read_bytes()
    assert main(["rm", "ck"]) == 0
    assert not Path(record.drafter).exists()      # the converted drafter went with the model


def test_pull_without_converter(hub_server, tiny_pair, monkeypatch):
    t_bytes, _, _ = tiny_pair
    hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    hub_server.add("test/ckpt", "config.json", b"{}")
    hub_server.add("test/ckpt", "pytorch_model.bin", b"x")
    monkeypatch.setitem(sys.modules, "localspec.converters.convert", None)   # import fails
    _catalog('[models.ck]\ndescription = "x"\n[models.ck.target]\nrepo = "test/tiny-GGUF"\n'
             'file = "tiny-target.gguf"\n[models.ck.draft]\nrepo = "test/ckpt"\n'
             'files = ["config.json", "pytorch_model.bin"]\n')
    with pytest.raises(LocalspecError, match=r"needs the converter \(not available\)"):
        pull("ck")
    assert registry.load("ck") is None


def test_modelfile_hf_references(hub_server, tiny_pair, tmp_path):
    t_bytes, d_bytes, _ = tiny_pair
    hub_server.add("test/tiny-GGUF", "tiny-target.gguf", t_bytes)
    hub_server.add("test/tiny-eagle3", "tiny-drafter.gguf", d_bytes)
    mf = tmp_path / "Modelfile"
    mf.write_text("FROM hf.co/test/tiny-GGUF/tiny-target.gguf\n"
                  f"DRAFT hf.co/test/tiny-eagle3/tiny-drafter.gguf@{COMMIT}\n")
    assert main(["create", "viahub", "-f", str(mf)]) == 0
    spec = resolve("viahub")
    assert spec.target.read_bytes() == t_bytes and spec.drafter.read_bytes() == d_bytes


def test_parse_hf_ref():
    assert parse_hf_ref("hf.co/a/b") == parse_hf_ref("hf://a/b")
    r = parse_hf_ref("https://huggingface.co/o/r/resolve/main/sub/x.gguf")
    assert (r.repo, r.path, r.revision) == ("o/r", "sub/x.gguf", "main")
    r = parse_hf_ref(f"hf.co/o/r/x.gguf@{COMMIT}")
    assert (r.repo, r.path, r.revision) == ("o/r", "x.gguf", COMMIT)
    assert parse_hf_ref("./models/x.gguf") is None and parse_hf_ref("qwen3-8b") is None


def test_pull_an_mtp_pair_needs_no_drafter_file_and_checks_the_heads(hub_server, tmp_path):
    """A catalog entry with ``source = "mtp"``: only the target is downloaded, the model drafts with
    its own heads (``mtp``); a file without heads under such an entry is one clear error."""
    import os

    from cli_run import run_cli
    from localspec import Engine
    from mtp_models import build_mtp_target

    with_heads = build_mtp_target(tmp_path / "mtp.gguf", heads=1).read_bytes()
    without = build_mtp_target(tmp_path / "trunk.gguf", heads=1, with_heads=False).read_bytes()
    hub_server.add("test/tiny-MTP-GGUF", "tiny-mtp.gguf", with_heads)
    hub_server.add("test/tiny-MTP-GGUF", "tiny-trunk.gguf", without)
    entry = ('[models.{0}]\ndescription = "tiny MTP target"\nsource = "mtp"\n'
             '[models.{0}.target]\nrepo = "test/tiny-MTP-GGUF"\nfile = "{1}"\n')
    _catalog(entry.format("tinymtp", "tiny-mtp.gguf") + entry.format("tinytrunk", "tiny-trunk.gguf"))
    assert main(["pull", "tinymtp"]) == 0
    spec = resolve("tinymtp")
    assert spec.drafter is None and spec.target.read_bytes() == with_heads
    with Engine(spec.target, n_ctx=128) as engine:
        assert engine.mtp_heads == 1 and engine.drafter.name == "mtp"
    listed = run_cli("list", env={**os.environ, "COLUMNS": "300"}).stdout
    assert "mtp (the target's own heads)" in next(line for line in listed.splitlines() if " tinymtp " in line)
    with pytest.raises(LocalspecError, match="drafts with its own MTP heads, but the file has none"):
        pull("tinytrunk")
    assert registry.load("tinytrunk") is None
