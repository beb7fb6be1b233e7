"""A Modelfile's TEMPLATE (Jinja, the GGUF template's renderer) and raw prompts with special tokens."""

from __future__ import annotations

import json

import pytest

from localspec import DoneEvent, Engine, GenerationConfig, LocalspecError, Message
from localspec.formats.chat_format import check_template
from localspec.cli import main
from localspec.store.models import resolve
from cli_run import run_cli

QUESTION = "What is the capital of France?"
# ChatML like SmolLM2's own template, with a fixed system line of its own: a different prompt
JINJA = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\nIn one word:{% endif %}")
RENDERED = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\nIn one word:"


def test_go_templates_and_broken_templates_are_refused():
    for go in ("{{ .Prompt }}", "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}",
               "{{- range .Messages }}{{ .Content }}{{ end }}"):
        with pytest.raises(LocalspecError, match="Ollama Go template; only Jinja chat templates are supported"):
            check_template(go)
    with pytest.raises(LocalspecError, match="not a valid Jinja chat template"):
        check_template("{% for message in messages %}")
    with pytest.raises(LocalspecError, match="never uses `messages`"):
        check_template("Hello {{ name }}")
    check_template(JINJA)


def test_create_rejects_a_go_template_with_one_line(smollm2, tmp_path, capsys):
    (tmp_path / "Modelfile").write_text(f'FROM {smollm2}\nTEMPLATE """{{{{ .Prompt }}}}"""\n')
    assert main(["create", "gotpl", "-f", str(tmp_path / "Modelfile")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Modelfile:2" in err
    assert "only Jinja chat templates are supported" in err
    proc = run_cli("create", "gotpl", "-f", str(tmp_path / "Modelfile"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_engine_renders_with_a_template_override(smollm2):
    with Engine(smollm2, n_ctx=512, chat_template=JINJA) as engine:
        tokens = engine.prompt_tokens([Message("user", QUESTION)])
        assert tokens == engine.model.tokenize(RENDERED, add_special=True, parse_special=True)
    with pytest.raises(LocalspecError, match="Go template"):   # a TEMPLATE stored before create checked it
        Engine(smollm2, n_ctx=512, chat_template="{{ .Prompt }}")


def test_modelfile_template_takes_effect_and_raw_prompts_parse_special_tokens(smollm2, tmp_path):
    """A created model's TEMPLATE renders the chat; the same text sent with --raw gives the same
    reply (its <|im_start|> become special tokens); --no-special sends them as plain text."""
    (tmp_path / "Modelfile").write_text(f'FROM {smollm2}\nTEMPLATE """{JINJA}"""\n')
    assert main(["create", "oneword", "-f", str(tmp_path / "Modelfile")]) == 0
    assert resolve("oneword").template == JINJA

    def generate(*args: str) -> str:
        proc = run_cli("generate", *args, "--no-spec", "-n", "16", "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["text"]

    templated = generate("oneword", "--prompt", QUESTION)
    assert templated == generate("--target", str(smollm2), "--raw", "--prompt", RENDERED)
    assert templated != generate("--target", str(smollm2), "--prompt", QUESTION)      # the GGUF's template
    assert templated != generate("--target", str(smollm2), "--raw", "--no-special", "--prompt", RENDERED)
    proc = run_cli("generate", "--target", str(smollm2), "--prompt", "x", "--no-special")
    assert proc.returncode == 2 and "--no-special" in proc.stderr


def test_raw_prompt_special_tokens_in_the_python_api(smollm2):
    with Engine(smollm2, n_ctx=512) as engine:
        im_start = engine.model.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert len(im_start) == 1 and im_start[0] != engine.model.tokenize("<", add_special=False)[0]
        im_start = im_start[0]
        parsed = engine.prompt_tokens("<|im_start|>user\nHi")
        assert parsed.count(im_start) == 1 and parsed[0] == im_start     # no doubled BOS either
        literal = engine.prompt_tokens("<|im_start|>user\nHi", parse_special=False)
        assert im_start not in literal[1:] and len(literal) > len(parsed)
        # generate() follows GenerationConfig.parse_special
        for parse in (True, False):
            done = [e for e in engine.generate("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                                               GenerationConfig(max_tokens=4, spec=False, parse_special=parse))
                    if isinstance(e, DoneEvent)][0]
            expected = engine.prompt_tokens("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                                            parse_special=parse)
            assert done.stats.prompt_tokens == len(expected)
