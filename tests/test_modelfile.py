"""Modelfile parsing and writing: every instruction, quoting, and each error with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.core.errors import LocalspecError
from localspec.formats.modelfile import Modelfile, dumps, load, parse

FULL = '''# a pair for testing
from ./target.gguf
Draft ./drafter.gguf

PARAMETER temperature 0.7
parameter top_k 20
PARAMETER top_p 0.9
PARAMETER min_p 0.05
PARAMETER seed 42
PARAMETER num_ctx 2048
PARAMETER num_predict 128
PARAMETER repeat_penalty 1.1
PARAMETER stop "<|im_end|>"
PARAMETER stop <|endoftext|>
PARAMETER draft_max 6
PARAMETER draft_policy fixed
PARAMETER draft_tree true
PARAMETER draft_p_min 0.4
TEMPLATE """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}"""
SYSTEM You are a # helpful assistant.
MESSAGE user "Is \\"this\\" quoted?"
MESSAGE assistant """Yes,
it is."""
LICENSE """MIT License

Permission is hereby granted..."""
LICENSE Apache-2.0
'''


def test_every_instruction():
    mf = parse(FULL)
    assert mf.from_ == "./target.gguf"
    assert mf.draft == "./drafter.gguf"
    assert mf.parameters == {
        "temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 42, "num_ctx": 2048,
        "num_predict": 128, "repeat_penalty": 1.1, "stop": ["<|im_end|>", "<|endoftext|>"],
        "draft_max": 6, "draft_policy": "fixed", "draft_tree": True, "draft_p_min": 0.4,
    }
    assert mf.template == "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    assert mf.system == "You are a # helpful assistant."       # '#' inside a line is text
    assert mf.messages == [("user", 'Is "this" quoted?'), ("assistant", "Yes,\nit is.")]
    assert mf.license == ["MIT License\n\nPermission is hereby granted...", "Apache-2.0"]
    assert mf.speculative() == {"draft_max": 6, "draft_policy": "fixed", "draft_tree": True, "draft_p_min": 0.4}
    assert "draft_max" not in mf.generation() and mf.generation()["seed"] == 42
    assert mf.lines["FROM"] == 2 and mf.lines["DRAFT"] == 3


def test_minimal_and_case_insensitive():
    mf = parse("  # only a comment\n\n   fRoM   llama3.1-8b   \n")
    assert mf == Modelfile(from_="llama3.1-8b", lines=mf.lines)
    assert parse('FROM x\nsystem """one line"""').system == "one line"
    assert parse('FROM x\nPARAMETER draft_tree FALSE').parameters == {"draft_tree": False}


def test_paths_are_relative_to_the_modelfile(tmp_path, monkeypatch):
    d = tmp_path / "pair"
    d.mkdir()
    (d / "Modelfile").write_text("FROM ./t.gguf\nDRAFT ../elsewhere/d.gguf\n")
    monkeypatch.chdir(tmp_path.parent)
    mf = load(d / "Modelfile")
    assert mf.resolve_path(mf.from_) == d / "t.gguf"
    assert mf.resolve_path(mf.draft) == (d / "../elsewhere/d.gguf").absolute()
    assert mf.resolve_path("/abs/x.gguf") == Path("/abs/x.gguf")
    assert load(d).from_ == "./t.gguf"        # a directory means its Modelfile


@pytest.mark.parametrize("text, line, message", [
    ("FROM x\nFOO bar\n", 2, "unknown instruction 'FOO' (expected one of FROM, DRAFT, PARAMETER"),
    ("FROM x\nADAPTER ./lora.gguf\n", 2, "ADAPTER (LoRA adapters) is not supported"),
    ("# c\nFROM\n", 2, "FROM needs a target .gguf path, a model name or an hf.co"),
    ("FROM x\nDRAFT\n", 2, "DRAFT needs a drafter .gguf path, a drafter checkpoint directory"),
    ("FROM x\nSYSTEM   \n", 2, "SYSTEM needs a system message"),
    ("FROM x\nTEMPLATE\n", 2, "TEMPLATE needs a chat template"),
    ("FROM x\nLICENSE\n", 2, "LICENSE needs license text"),
    ("FROM x\nMESSAGE\n", 2, "MESSAGE needs a role (system, user or assistant) and a message"),
    ("FROM x\nMESSAGE user\n", 2, "MESSAGE user needs a message"),
    ("FROM x\nMESSAGE tool hi\n", 2, "MESSAGE role 'tool' is not one of system, user, assistant"),
    ("FROM x\nPARAMETER\n", 2, "PARAMETER needs a parameter name and a value"),
    ("FROM x\nPARAMETER temperature\n", 2, "PARAMETER temperature needs a value"),
    ("FROM x\n\nPARAMETER warmth 1\n", 3, "unknown parameter 'warmth' (expected one of:"),
    ("FROM x\nPARAMETER temperature hot\n", 2, "PARAMETER temperature expects a number, got 'hot'"),
    ("FROM x\nPARAMETER top_k 2.5\n", 2, "PARAMETER top_k expects an integer, got '2.5'"),
    ("FROM x\nPARAMETER draft_tree maybe\n", 2, "PARAMETER draft_tree expects true or false, got 'maybe'"),
    ("FROM x\nPARAMETER draft_max 99\n", 2, "PARAMETER draft_max must be between 1 and 32, got 99"),
    ("FROM x\nPARAMETER draft_policy eager\n", 2, "PARAMETER draft_policy must be auto or fixed"),
    ("FROM x\nPARAMETER draft_p_min 1.5\n", 2, "PARAMETER draft_p_min must be in [0, 1]"),
    ("FROM x\nPARAMETER top_p 0\n", 2, "PARAMETER top_p must be in (0, 1]"),
    ("FROM x\nPARAMETER seed 1\nPARAMETER seed 2\n", 3, "PARAMETER seed given twice (first on line 2)"),
    ("FROM x\nFROM y\n", 2, "FROM given twice (first on line 1)"),
    ("FROM x\nDRAFT a.gguf\nDRAFT b.gguf\n", 3, "DRAFT given twice (first on line 2)"),
    ("FROM x\nSYSTEM a\nsystem b\n", 3, "SYSTEM given twice (first on line 2)"),
    ("FROM x\nTEMPLATE a\nTEMPLATE b\n", 3, "TEMPLATE given twice (first on line 2)"),
    ('FROM x\nSYSTEM """never\nclosed\n', 2, 'SYSTEM: unterminated """ string (expected a closing """)'),
    ('FROM x\nSYSTEM "open\n', 2, 'SYSTEM: unterminated " string (expected a closing " on the same line)'),
    ('FROM x\nSYSTEM "a" b\n', 2, "unexpected text after the closing quote of SYSTEM: 'b'"),
    ('FROM x\nTEMPLATE """a\nb""" c\n', 3, "unexpected text after the closing \"\"\" of TEMPLATE: 'c'"),
    ('FROM ""\n', 1, "FROM needs a target .gguf path"),
])
def test_errors_name_file_and_line(text, line, message):
    with pytest.raises(LocalspecError) as info:
        parse(text, path="pair/Modelfile")
    assert str(info.value).startswith(f"pair/Modelfile:{line}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_from():
    with pytest.raises(LocalspecError, match=r"^M: FROM is required \(no FROM line found"):
        parse("# nothing\nSYSTEM hi\n", path="M")


def test_load_errors(tmp_path):
    with pytest.raises(LocalspecError, match="no such file"):
        load(tmp_path / "absent")
    bad = tmp_path / "Modelfile"
    bad.write_bytes(b"FROM \xff\xfe\n")
    with pytest.raises(LocalspecError, match="not a text file"):
        load(bad)


def test_round_trip_full():
    mf = parse(FULL)
    again = parse(dumps(mf, header="generated\n\nby a test"))
    assert again == mf


@pytest.mark.parametrize("value", [
    "plain", "  leading and trailing  ", '"starts with a quote', "# looks like a comment",
    'back\\slash "quoted"', "multi\nline", "\nstarts with a newline", 'has """ inside', "",
])
def test_round_trip_values(value):
    mf = Modelfile(from_="./t.gguf", system=value, messages=[("user", value or "x")],
                   parameters={"stop": [value or "s", "END"]})
    assert parse(dumps(mf)) == mf


def test_unwritable_value():
    with pytest.raises(LocalspecError, match='SYSTEM: a multi-line value containing """'):
        dumps(Modelfile(from_="x", system='a\n"""b'))


def test_the_modules_example_parses_and_its_template_renders():
    """The syntax example in the module's docstring is a Modelfile the parser takes, with a TEMPLATE
    the chat template check takes and that renders a conversation."""
    import textwrap

    from localspec.formats import modelfile
    from localspec.formats.chat_format import ChatFormatter, Message

    block = modelfile.__doc__.split("::\n\n", 1)[1].split("\n\nInstructions", 1)[0]
    mf = parse(textwrap.dedent(block))
    assert mf.from_ == "./Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf" and mf.parameters["draft_max"] == 6
    assert mf.messages and mf.license and mf.system == "You are a helpful assistant."
    chat = ChatFormatter(mf.template, from_modelfile=True)   # checks it as `create` does
    assert chat.render([Message("user", "Hello")]) == "user: Hello\nassistant: "
