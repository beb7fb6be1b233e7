"""The catalog (models.toml) and the user's models: create, list, show, rm, resolve, generate."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from localspec.store import install, registry
from localspec.cli import main
from localspec.core.errors import LocalspecError
from localspec.formats.modelfile import dumps, load, parse
from localspec.store.models import DEFAULT_MODEL, apply_model_defaults, resolve

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import tiny_models

    d = tmp_path_factory.mktemp("tiny")
    target = tiny_models.build_target(d / "target.gguf")
    drafter = tiny_models.build_drafter(d / "drafter.gguf", target)
    return target, drafter


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# catalog


def test_shipped_catalog_is_valid_and_curated():
    cat = registry.load_catalog()
    assert cat[DEFAULT_MODEL].embedded
    llama = cat["llama3.1-8b"]
    assert llama.draft.repo == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    qwen = [e for n, e in cat.items() if n.startswith("qwen3-") and e.draft.variant != "dspark"]
    assert len(qwen) >= 4 and all(e.draft.repo.startswith("AngelSlim/") for e in qwen)
    dspark = [e for n, e in cat.items() if n.endswith("-dspark")]   # DeepSeek's block drafters
    assert len(dspark) >= 2 and all(e.draft.repo.startswith("deepseek-ai/dspark_") and e.draft.variant == "dspark"
                                    for e in dspark)
    assert any(n.startswith("gpt-oss") for n in cat) and any(n.startswith("gemma4") for n in cat)
    assert any(e.draft is not None and e.draft.variant == "eagle3.1" for e in cat.values())
    for name, e in cat.items():
        assert e.embedded or e.target.file.endswith(".gguf"), name


def test_root_models_toml_is_the_shipped_file():
    assert (ROOT / "models.toml").read_text(encoding="utf-8") == registry.shipped_catalog_text()


@pytest.mark.parametrize("entry, message", [
    ('[models.x]\ndescription = "d"\n', "models.x: Value error, give either embedded" ),
    ('[models.x]\ndescription = "d"\n[models.x.target]\nrepo = "a/b"\nfile = "f.bin"\n', "models.x.target.file"),
    ('[models.x]\ndescription = "d"\n[models.x.target]\nrepo = "nope"\nfile = "f.gguf"\n', "models.x.target.repo"),
    ('[models.x]\ndescription = "d"\n[models.x.target]\nrepo = "a/b"\nfile = "f.gguf"\nsha256 = "xyz"\n',
     "models.x.target.sha256"),
    ('[models.x]\ndescription = "d"\nembedded = true\ncolour = "red"\n', "models.x.colour"),
    ('[models.x]\ndescription = "d"\nembedded = true\n[models.x.draft]\nrepo = "a/b"\nfile = "d.gguf"\n'
     'files = ["config.json"]\n', "give either file"),
    ('[models.x]\ndescription = "d"\nembedded = true\n[models.x.draft]\nrepo = "a/b"\nfiles = ["w.bin"]\n',
     "must include config.json"),
    ('[models.x]\ndescription = "d"\nembedded = true\n[models.x.draft]\nrepo = "a/b"\nfile = "d.gguf"\n'
     'variant = "eagle4"\n', "models.x.draft.variant"),
    ('[models.x]\ndescription = "d"\nembedded = true\n[models.x.parameters]\ntemperature = "hot"\n',
     "PARAMETER temperature expects a number"),
    ('[models.x]\ndescription = "d"\nembedded = true\n[models.x.parameters]\ndraft_max = 0\n',
     "draft_max must be between 1 and 32"),
    ('[models."bad name"]\ndescription = "d"\nembedded = true\n', "invalid model name 'bad name'"),
    ('[models.x\n', "not valid TOML"),
])
def test_catalog_schema_errors(entry, message):
    registry.user_catalog_path().write_text("schema = 1\n" + entry, encoding="utf-8")
    with pytest.raises(LocalspecError) as info:
        registry.load_catalog()
    text = str(info.value)
    assert text.startswith(str(registry.user_catalog_path()) + ": ")
    assert message.replace("Value error, ", "") in text and "\n" not in text


def test_user_catalog_overrides_and_extends():
    registry.user_catalog_path().write_text(
        'schema = 1\n[models.mine]\ndescription = "mine"\nembedded = true\n'
        '[models.mine.parameters]\ntemperature = 0.2\nstop = ["A", "B"]\ndraft_max = 2\n', encoding="utf-8")
    cat = registry.load_catalog()
    assert "llama3.1-8b" in cat and cat["mine"].parameters["stop"] == ["A", "B"]
    spec = resolve("mine")                     # an embedded entry resolves without a pull
    assert spec.parameters == {"temperature": 0.2, "stop": ["A", "B"]} and spec.draft_params == {"draft_max": 2}
    with pytest.raises(LocalspecError, match="not downloaded: run `localspec pull qwen3-8b`"):
        resolve("qwen3-8b")


# --------------------------------------------------------------------------------------------
# create / list / show / rm


MODELFILE = '''# tiny pair
FROM ./target.gguf
DRAFT ./drafter.gguf
PARAMETER temperature 0.3
PARAMETER stop "</s>"
PARAMETER stop "<|im_end|>"
PARAMETER num_predict 3
PARAMETER num_thread 1
PARAMETER draft_max 2
PARAMETER draft_p_min 0.25
TEMPLATE """{% for m in messages %}{{ m['content'] }}
{% endfor %}"""
SYSTEM """Be brief.
Very brief."""
MESSAGE user Hi
MESSAGE assistant Hello!
LICENSE MIT
'''


@pytest.fixture
def pair_dir(tmp_path, tiny):
    d = tmp_path / "pair"
    d.mkdir()
    (d / "target.gguf").symlink_to(tiny[0])
    (d / "drafter.gguf").symlink_to(tiny[1])
    write(d / "Modelfile", MODELFILE)
    return d


def test_create_show_round_trip(pair_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)                  # paths are relative to the Modelfile, not the cwd
    assert main(["create", "tiny", "-f", str(pair_dir / "Modelfile")]) == 0
    assert "created tiny" in capsys.readouterr().out

    assert main(["show", "tiny", "--modelfile"]) == 0
    shown = capsys.readouterr().out
    again = parse(shown)
    original = load(pair_dir / "Modelfile")
    assert Path(again.from_) == pair_dir / "target.gguf" and Path(again.draft) == pair_dir / "drafter.gguf"
    for field in ("parameters", "template", "system", "messages", "license"):
        assert getattr(again, field) == getattr(original, field), field

    # the shown Modelfile recreates the same model from anywhere
    write(tmp_path / "elsewhere" / "Modelfile", shown)
    assert main(["create", "copy", "-f", str(tmp_path / "elsewhere" / "Modelfile")]) == 0
    a, b = registry.load("tiny"), registry.load("copy")
    assert (a.target, a.drafter, a.parameters, a.system, a.messages) == (b.target, b.drafter, b.parameters,
                                                                        b.system, b.messages)
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "copy" in out
    assert main(["show", "tiny"]) == 0
    assert "Be brief." in capsys.readouterr().out


def test_resolve_uses_created_model(pair_dir):
    install.create("tiny", load(pair_dir / "Modelfile"))
    spec = resolve("tiny")
    assert spec.target == pair_dir / "target.gguf" and spec.drafter == pair_dir / "drafter.gguf"
    assert spec.parameters == {"temperature": 0.3, "stop": ["</s>", "<|im_end|>"], "num_predict": 3,
                               "num_thread": 1}
    assert spec.draft_params == {"draft_max": 2, "draft_p_min": 0.25}
    assert spec.system == "Be brief.\nVery brief."
    assert spec.template == "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    assert spec.messages == [("user", "Hi"), ("assistant", "Hello!")]
    assert resolve("tiny", draft="/x/other.gguf").drafter == Path("/x/other.gguf")

    # a user model shadows a catalog entry of the same name
    install.create("qwen3-8b", parse(f"FROM {pair_dir / 'target.gguf'}\n", path="M"))
    assert resolve("qwen3-8b").target == pair_dir / "target.gguf"


def test_from_a_model_name_inherits(pair_dir):
    install.create("base", load(pair_dir / "Modelfile"))
    install.create("child", parse("FROM base\nPARAMETER temperature 0.9\nSYSTEM other\n", path="M"))
    child = resolve("child")
    assert child.drafter == pair_dir / "drafter.gguf"
    assert child.parameters["temperature"] == 0.9 and child.parameters["num_predict"] == 3
    assert child.draft_params["draft_max"] == 2 and child.system == "other"
    install.create("plain", parse(f"FROM {DEFAULT_MODEL}\n", path="M"))
    assert resolve("plain").target == resolve(DEFAULT_MODEL).target


@pytest.mark.parametrize("text, message", [
    ("# x\n\nFROM ./absent.gguf\n", "Modelfile:3: {d}/absent.gguf: no such file (expected a target .gguf)"),
    ("FROM ./target.gguf\nDRAFT ./absent.gguf\n", "Modelfile:2: {d}/absent.gguf: no such file or directory"),
    ("FROM ./target.gguf\n\nDRAFT ./target.gguf\n", "Modelfile:3: target.gguf is not an EAGLE-3 drafter"),
    ("FROM ./drafter.gguf\n", "Modelfile:1: drafter.gguf is an EAGLE-3 drafter, not a target model"),
    ("FROM ./Modelfile.txt\n", "Modelfile:1: {d}/Modelfile.txt: not a GGUF file"),
    ("FROM no-such-model\n", "Modelfile:1: 'no-such-model' is neither a file nor a known model"),
    ("FROM qwen3-8b\n", "not downloaded: run `localspec pull qwen3-8b`"),
    ("FROM .\n", "Modelfile:1: {d} is a directory; localspec needs a GGUF target file"),
    ("FROM ./target.gguf\nDRAFT ./Modelfile.txt\n", "Modelfile:2: {d}/Modelfile.txt is not a .gguf"),
    ("FROM ./target.gguf\nDRAFT ./ckpt\n", "Modelfile:2: {d}/ckpt has no config.json"),
    ("FROM hf.co/a/b\n", "Modelfile:1: 'hf.co/a/b': a Hugging Face target must name a .gguf file"),
    ("FROM ./target.gguf\nPARAMETER temperature -1\n", "Modelfile:2: PARAMETER temperature must be >= 0"),
])
def test_create_errors_name_the_line(pair_dir, capsys, text, message):
    write(pair_dir / "Modelfile", text)
    write(pair_dir / "Modelfile.txt", "not gguf")
    (pair_dir / "ckpt").mkdir(exist_ok=True)
    assert main(["create", "bad", "-f", str(pair_dir / "Modelfile")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message.format(d=pair_dir) in err
    assert registry.load("bad") is None
    assert not list(registry.models_dir().glob("*")) if registry.models_dir().exists() else True


def test_create_bad_name_and_missing_file(pair_dir, capsys):
    assert main(["create", "../evil", "-f", str(pair_dir / "Modelfile")]) == 1
    assert "invalid model name '../evil'" in capsys.readouterr().err
    assert main(["create", "x.gguf", "-f", str(pair_dir / "Modelfile")]) == 1
    assert main(["create", "ok", "-f", str(pair_dir / "nope")]) == 1
    assert "nope: no such file" in capsys.readouterr().err


def test_draft_checkpoint_needs_converter(pair_dir, monkeypatch, capsys):
    write(pair_dir / "ckpt" / "config.json", "{}")
    write(pair_dir / "Modelfile", "FROM ./target.gguf\nDRAFT ./ckpt\n")
    monkeypatch.setitem(sys.modules, "localspec.converters.convert", None)
    assert main(["create", "ck", "-f", str(pair_dir / "Modelfile")]) == 1
    assert "Modelfile:2: converting drafter checkpoints needs the converter (not available)" in capsys.readouterr().err


def test_draft_checkpoint_is_converted_and_removed_with_the_model(pair_dir, tiny, monkeypatch):
    write(pair_dir / "ckpt" / "config.json", "{}")
    write(pair_dir / "Modelfile", "FROM ./target.gguf\nDRAFT ./ckpt\n")
    seen = []

    def convert_checkpoint(src, target_gguf, out_path, outtype="f16", force=False):
        seen.append((Path(src), Path(target_gguf)))
        Path(out_path).write_bytes(tiny[1].read_bytes())

    fake = types.ModuleType("localspec.converters.convert")
    fake.convert_checkpoint = convert_checkpoint
    monkeypatch.setitem(sys.modules, "localspec.converters.convert", fake)
    record = install.create("ck", load(pair_dir / "Modelfile"))
    assert seen == [(pair_dir / "ckpt", pair_dir / "target.gguf")]
    drafter = Path(record.drafter)
    assert drafter.parent == registry.drafters_dir() and drafter.is_file()
    assert not [p for p in registry.drafters_dir().iterdir() if p.name.endswith(".tmp")]
    assert main(["rm", "ck"]) == 0
    assert not drafter.exists() and registry.load("ck") is None
    assert (pair_dir / "ckpt" / "config.json").exists()          # sources are never touched


def test_rm_and_unknown(pair_dir, capsys):
    install.create("tiny", load(pair_dir / "Modelfile"))
    assert main(["rm", "tiny"]) == 0
    assert (pair_dir / "target.gguf").exists()                 # user files stay
    assert main(["rm", "tiny"]) == 1
    assert "model 'tiny' not found" in capsys.readouterr().err
    assert main(["show", "tiny"]) == 1


def test_records_are_written_atomically(pair_dir, monkeypatch):
    install.create("tiny", load(pair_dir / "Modelfile"))
    path = registry.record_path("tiny")
    before = path.read_text()
    assert json.loads(before)["name"] == "tiny"

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        install.create("tiny", parse(f"FROM {pair_dir / 'target.gguf'}\n", path="M"))
    assert path.read_text() == before                            # old record intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.json"]   # no temp file left


def test_damaged_record(capsys):
    write(registry.models_dir() / "broken.json", '{"name": 3}')
    assert main(["show", "broken"]) == 1
    assert "damaged model record" in capsys.readouterr().err
    assert main(["rm", "broken"]) == 0


# --------------------------------------------------------------------------------------------
# generate applies the model's PARAMETERs


def test_apply_model_defaults():
    from localspec.store.models import ModelSpec

    spec = ModelSpec("m", Path("t.gguf"), parameters={"temperature": 0.3, "num_predict": 7, "num_ctx": 512,
                                                       "stop": ["x"], "mirostat": 1, "num_predict_x": 1,
                                                       "num_thread": 0},
                     draft_params={"draft_max": 3, "draft_policy": "fixed", "draft_tree": False, "draft_p_min": 0.5})
    from localspec.cli.generate import Policy, Tree

    opts = dict(max_tokens=256, temperature=0.0, stop=[], ctx=4096, threads=None, policy=Policy.auto, draft_max=4,
                tree=Tree.auto, p_min=0.3)
    out = apply_model_defaults(spec, opts, lambda name: name != "temperature")
    assert out == dict(max_tokens=7, temperature=0.0, stop=["x"], ctx=512, threads=None, policy=Policy.fixed,
                       draft_max=3, tree=Tree.off, p_min=0.5)   # num_thread 0: automatic
    assert list(out) == list(opts)


def test_chat_starts_from_model_parameters(pair_dir):
    from localspec.cli.chat import chat_settings

    install.create("tiny", load(pair_dir / "Modelfile"))
    spec = resolve("tiny")
    given = dict(max_tokens=512, temperature=0.0, ctx=4096, threads=None)
    settings, ctx, threads = chat_settings(spec, system=None, given=given,
                                           is_default=lambda name: name != "temperature")
    assert (settings.max_tokens, settings.temperature, settings.stop) == (3, 0.0, ("</s>", "<|im_end|>"))
    assert (settings.draft_max, settings.p_min, ctx, threads) == (2, 0.25, 4096, 1)
    assert settings.system == "Be brief.\nVery brief."
    config = settings.config(True)
    assert config.stop == ("</s>", "<|im_end|>") and config.policy.p_min == 0.25
    # flags given on the command line win; --system wins over SYSTEM
    settings, _, threads = chat_settings(spec, system="terse", given={**given, "threads": 2},
                                         is_default=lambda name: False)
    assert (settings.max_tokens, settings.system, settings.draft_max, threads) == (512, "terse", 2, 2)


def test_generate_uses_model_parameters(pair_dir, capsys):
    install.create("tiny", load(pair_dir / "Modelfile"))
    assert main(["generate", "tiny", "-p", "hello", "--json", "--threads", "1", "--ctx", "256"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "tiny" and result["n_tokens"] == 3      # num_predict 3
    assert main(["generate", "tiny", "-p", "hello", "--json", "-n", "5", "--threads", "1", "--ctx", "256"]) == 0
    assert json.loads(capsys.readouterr().out)["n_tokens"] == 5      # the flag wins
