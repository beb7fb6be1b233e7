"""Every declared option (localspec.core.options.OPTIONS) against every surface a user sets it on:
the CLI's flags (click parameters and what a command accepts), the server's request fields (JSON
schema and validation), the Modelfile PARAMETER table, the chat's settings and the Python API's
dataclasses. A disagreement of default, type or range anywhere fails here.

Ranges are probed at their edges: each closed end and special value is accepted, the value just
past each end is refused, naming the value where the surface names things (the flag, the request
field in ``param``, the PARAMETER)."""

from __future__ import annotations

import math
from dataclasses import fields
from enum import Enum

import pydantic
import pytest
import typer
from click.testing import CliRunner

from localspec.cli import _register
from localspec.cli.app import app
from localspec.core import options
from localspec.core.errors import LocalspecError
from localspec.core.options import AUTO_DRAFT_MAX, DEFAULT_CTX, FIXED_DRAFT_MAX, OPTIONS
from localspec.formats.modelfile import PARAMETERS, check_parameter
from localspec.runtime.config import GenerationConfig
from localspec.runtime.generation_options import GenerationOptions, default_draft_max
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from localspec.server.errors import APIError
from localspec.server.params import SAMPLING_FIELDS, checked
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest
from localspec.speculation.policy import PolicyConfig
from localspec.tui.settings import ChatSettings

MISSING = "/nonexistent/localspec-probe.gguf"

# A command's own default for a declared option, where it differs on purpose from the declaration
# (the Python API's, or the chat's for `chat`).
OWN_DEFAULTS = {
    ("bench", "max_tokens"): 128,       # a benchmark run is short
    ("serve", "max_tokens"): None,      # a request runs to the context's end unless it asks (OpenAI's)
    ("fit", "n_ctx"): None,             # fit chooses the largest context that fits
    ("train", "seed"): 0,               # training is always seeded
    ("serve", "parallel"): None,        # serve: as many slots as fit the memory budget, up to 4
    ("train", "parallel"): 16,          # train: sequences generated together while making its data
}
CHAT_COMMANDS = {"chat"}
# special values a command refuses on purpose
OWN_REFUSALS = {("train", "seed"): (options.RANDOM_SEED,)}   # training is always seeded: no random seed


# ---------------------------------------------------------------------------------------------
# probes: values at and just past each end of a range


def _step(opt) -> float:
    return 1 if opt.kind is int else 1e-3


def inside(opt) -> list:
    """Values the option accepts: each closed end, a value next to each open end, the specials."""
    if opt.kind is str:   # a listed option (--source): a comma list of its words too
        return list(opt.choices) + ([",".join(opt.choices[1:3])] if opt.listed else [])
    if opt.kind is bool:
        return [True, False]
    out = list(opt.special)
    for end, is_open, sign in ((opt.lo, opt.lo_open, 1), (opt.hi, opt.hi_open, -1)):
        if end is not None:
            out.append(opt.kind(end + sign * _step(opt)) if is_open else opt.kind(end))
    return out


def outside(opt) -> list:
    """Values the option refuses: just past each end (the end itself when open), not a special."""
    if opt.kind is str:   # a listed option: an unknown word in a list, auto in a list
        return ["nope"] + ([f"{opt.choices[1]},nope", f"{opt.choices[0]},{opt.choices[1]}"] if opt.listed else [])
    if opt.kind is bool:
        return []
    out = []
    for end, is_open, sign in ((opt.lo, opt.lo_open, -1), (opt.hi, opt.hi_open, 1)):
        if end is not None:
            value = opt.kind(end) if is_open else opt.kind(end + sign * _step(opt))
            if value not in opt.special:
                out.append(value)
    return out


def test_every_option_has_a_range_a_probe_and_a_default_that_is_in_range():
    for opt in OPTIONS.values():
        assert inside(opt), opt.name
        assert opt.kind in (str, bool) or outside(opt), f"{opt.name}: no end to probe"
        for value in inside(opt):
            assert opt.problem(value)[1] is None, (opt.name, value)
        for value in outside(opt):
            assert opt.problem(value)[1] is not None, (opt.name, value)
        for value in (opt.default, opt.chat_default):
            assert value is None or opt.problem(value)[1] is None, (opt.name, value)


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def cli():
    _register()
    return typer.main.get_command(app)


def _switches(opt) -> set[str]:
    """The option's flags: its flag (a bool's two switches, "--recall/--no-recall") and short flag."""
    return set(opt.flag.split("/")) | ({opt.short} if opt.short else set())


def _declared_params(command):
    """(option, click parameter) for each declared option the command takes."""
    by_flag = {f: opt for opt in OPTIONS.values() if opt.flag for f in opt.flag.split("/")}
    for param in command.params:
        if getattr(param, "param_type_name", None) == "option":   # typer's own click, or click
            hits = [by_flag[f] for f in param.opts if f in by_flag]
            if hits:
                yield hits[0], param


def _parsed_as(param):
    """What the CLI parses a parameter as: int, float, or the tuple of its choices."""
    described = getattr(param, "type_descriptor", None)   # typer >= 0.24 (its own click)
    kind = described.annotation if described is not None else param.type
    if isinstance(kind, type) and issubclass(kind, Enum):
        return tuple(m.value for m in kind)
    if hasattr(kind, "choices"):                          # click.Choice
        return tuple(kind.choices)
    if kind is str or getattr(kind, "name", None) == "text":   # a listed option: text the table checks
        return str
    return {"integer": int, "float": float, "boolean": bool}.get(getattr(kind, "name", None), kind)


def test_cli_flags_agree_with_the_declarations(cli):
    seen = set()
    for name, command in cli.commands.items():
        for opt, param in _declared_params(command):
            seen.add(opt.name)
            where = f"localspec {name} {opt.flag}"
            assert param.name == opt.cli_name, where
            assert set(param.opts) | set(getattr(param, "secondary_opts", ())) == _switches(opt), where
            default = param.default.value if isinstance(param.default, Enum) else param.default
            want = OWN_DEFAULTS.get((name, opt.name), opt.chat_default if name in CHAT_COMMANDS else opt.default)
            assert default == want, f"{where}: default {default!r}, declared {want!r}"
            assert _parsed_as(param) == (str if opt.listed else opt.choices or opt.kind), where
    assert {"max_tokens", "temperature", "min_p", "repeat_penalty", "policy", "draft_max", "n_ctx",
            "lr"} <= seen


def test_no_command_declares_a_table_flag_by_hand():
    """A flag of the table comes from it (``option(NAME)`` / ``with_options``), never from a
    ``typer.Option(..., "--flag")`` of a command's own, whose range and default the table cannot see
    (``fit --parallel`` was one)."""
    import ast
    from pathlib import Path

    import localspec

    flags = {f for opt in OPTIONS.values() for f in (opt.flag, opt.short) if f}
    root = Path(localspec.__file__).parent
    by_hand = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option":
                named = [a.value for a in node.args if isinstance(a, ast.Constant) and a.value in flags]
                by_hand += [f"{path.relative_to(root)}:{node.lineno} {f}" for f in named]
    assert len(list(root.rglob("cli/*.py"))) >= 10
    assert not by_hand, f"flags of the option table declared by hand: {by_hand}"


def test_help_texts_take_the_depths_from_the_constants(cli):
    for name in ("generate", "bench", "serve"):
        param = next(p for p in cli.commands[name].params if "--draft-max" in getattr(p, "opts", ()))
        assert f"auto {AUTO_DRAFT_MAX}, fixed {FIXED_DRAFT_MAX}" in param.help
    ctx = next(p for p in cli.commands["generate"].params if "--ctx" in getattr(p, "opts", ()))
    assert ctx.default == DEFAULT_CTX


# each command, with arguments that fail right after its options are checked (a missing file, a
# bad --max-body): an accepted value reaches that error, a refused one is named with its flag
PROBES = {
    "generate": (["-p", "hi", "--target", MISSING], "no such file"),
    "chat": (["--target", MISSING], "does not exist"),
    "bench": (["--prompts", MISSING], "no such prompts file"),
    "serve": (["--max-body", "1"], "--max-body"),
}


def _run(cli, args: list[str]):
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.exception


def _show(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@pytest.mark.parametrize("command", sorted(PROBES) + ["train"])
def test_cli_accepts_each_range_and_names_the_flag_past_it(cli, command, isolated_home, tmp_path):
    if command == "train":   # an existing --out without --force: refused right after the checks
        (tmp_path / "out.gguf").write_bytes(b"")
        base, reached = ["--out", str(tmp_path / "out.gguf")], "exists"
    else:
        base, reached = PROBES[command]
    for opt, _ in _declared_params(cli.commands[command]):
        if opt.kind is bool:   # a switch takes no value: each one reaches the command's own error
            for switch in _switches(opt):
                code, exc = _run(cli, [command, *base, switch])
                assert isinstance(exc, LocalspecError) and reached in str(exc), (command, switch, exc)
            continue
        for value in inside(opt):
            code, exc = _run(cli, [command, *base, opt.flag, _show(value)])
            if value in OWN_REFUSALS.get((command, opt.name), ()):
                assert f"({opt.flag})" in str(exc)
                continue
            assert isinstance(exc, LocalspecError) and reached in str(exc), (command, opt.flag, value, exc)
        for value in outside(opt):
            code, exc = _run(cli, [command, *base, opt.flag, _show(value)])
            if opt.choices and not opt.listed:   # click refuses a word that is not a choice
                assert code == 2, (command, opt.flag, value)
            else:
                assert isinstance(exc, LocalspecError) and f"({opt.flag})" in str(exc), (command, opt.flag, value, exc)


# ---------------------------------------------------------------------------------------------
# server


def _request(field: str, value, schema=ChatCompletionRequest):
    body = {"messages": [{"role": "user", "content": "hi"}]} if schema is ChatCompletionRequest else {"prompt": "hi"}
    return schema.model_validate({**body, field: value})


def test_request_fields_take_the_declared_ranges():
    declared = {opt.field: opt for opt in OPTIONS.values() if opt.field}
    assert set(SAMPLING_FIELDS) <= set(declared)
    for schema in (ChatCompletionRequest, CompletionRequest):
        props = schema.model_json_schema()["properties"]
        for field, opt in declared.items():
            shape = next(s for s in props[field]["anyOf"] if s.get("type") != "null")
            assert shape["type"] == {int: "integer", float: "number", bool: "boolean"}[opt.kind], field
            bounds = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
            assert {k: shape[v] for k, v in bounds.items() if v in shape} == opt.constraints(), field
            for value in inside(opt):
                assert getattr(_request(field, value, schema), field) == value, (field, value)
                if field in SAMPLING_FIELDS:
                    assert checked(field, value) == value
            for value in outside(opt):
                with pytest.raises(pydantic.ValidationError) as err:
                    _request(field, value, schema)
                assert err.value.errors()[0]["loc"] == (field,)
    for value in outside(OPTIONS["max_tokens"]):     # the chat endpoint's other name for max_tokens
        with pytest.raises(pydantic.ValidationError):
            _request("max_completion_tokens", value)


def test_a_table_error_in_a_request_names_its_field():
    for field, name in SAMPLING_FIELDS.items():
        opt = OPTIONS[name]
        for value in outside(opt) + [math.inf]:
            with pytest.raises(APIError) as err:
                checked(field, value)
            assert err.value.status == 400 and err.value.param == field, (field, value)


# ---------------------------------------------------------------------------------------------
# Modelfile


def test_modelfile_parameters_are_generated_from_the_declarations():
    for opt in OPTIONS.values():
        if not opt.parameter:
            continue
        entry = PARAMETERS[opt.parameter]
        assert entry.cli == opt.cli_name, opt.parameter
        if entry.kind is bool and opt.kind is str:   # draft_tree: true or false, setting --tree on or off
            assert set(opt.choices) >= {"on", "off"}
            continue
        assert (entry.kind, entry.option, entry.automatic) == (opt.kind, opt.name, opt.automatic), opt.parameter
        for value in inside(opt) + list(opt.automatic):
            assert check_parameter(opt.parameter, str(value)) == value, (opt.parameter, value)
        for value in outside(opt):
            if value in opt.automatic:
                continue
            with pytest.raises(ValueError, match=f"PARAMETER {opt.parameter} "):
                check_parameter(opt.parameter, str(value))
    # a PARAMETER tied to an option is declared there (num_gpu: only its range, no CLI default)
    for name, entry in PARAMETERS.items():
        if entry.option is not None and entry.cli is not None:
            assert OPTIONS[entry.option].parameter == name, name


# ---------------------------------------------------------------------------------------------
# the chat's settings and the Python API


def test_dataclass_defaults_are_the_declared_ones():
    for f in fields(SamplingParams):
        assert getattr(SamplingParams(), f.name) == options.default(f.name), f.name
        assert getattr(CHAT_SAMPLING, f.name) == options.chat_default(f.name), f.name
    policy = PolicyConfig()
    for f in fields(PolicyConfig):
        name = "policy" if f.name == "name" else f.name
        want = default_draft_max(options.default("policy"), options.default("draft_max")) \
            if name == "draft_max" else options.default(name)
        assert getattr(policy, f.name) == want, f.name
    assert GenerationConfig().max_tokens == options.default("max_tokens")
    for f in fields(GenerationOptions):
        if f.name in OPTIONS:
            assert getattr(GenerationOptions(), f.name) == options.default(f.name), f.name
    settings = ChatSettings()
    for f in fields(ChatSettings):
        if f.name in OPTIONS:
            assert getattr(settings, f.name) == options.chat_default(f.name), f.name
    assert settings.effective_draft_max == AUTO_DRAFT_MAX
    assert ChatSettings(policy="fixed").effective_draft_max == FIXED_DRAFT_MAX


def test_dataclasses_and_chat_settings_take_each_range():
    sampling = {f.name for f in fields(SamplingParams)}
    policy = {f.name for f in fields(PolicyConfig)} | {"policy"}
    chat = {f.name for f in fields(ChatSettings)}
    for opt in OPTIONS.values():
        builders = []
        if opt.name in sampling:
            builders.append(lambda v, n=opt.name: SamplingParams(**{n: v}))
        if opt.name in policy:
            builders.append(lambda v, n=opt.name: PolicyConfig(**{("name" if n == "policy" else n): v}))
        if opt.name in chat:
            builders.append(lambda v, n=opt.name: ChatSettings(**{n: v}).config(True))
        if opt.name == "max_tokens":
            builders.append(lambda v: GenerationConfig(max_tokens=v))
        for build in builders:
            for value in inside(opt):
                build(value)
            for value in outside(opt):
                with pytest.raises(LocalspecError, match=opt.label or opt.name):
                    build(value)


def test_min_p_one_works_everywhere(cli, isolated_home):
    opt = OPTIONS["min_p"]
    assert opt.problem(1.0)[1] is None
    assert SamplingParams(min_p=1.0).min_p == 1.0
    assert ChatSettings(min_p=1.0).config(True).sampling.min_p == 1.0
    assert _request("min_p", 1.0).min_p == 1.0 and checked("min_p", 1.0) == 1.0
    assert check_parameter("min_p", "1.0") == 1.0
    code, exc = _run(cli, ["generate", *PROBES["generate"][0], "--min-p", "1.0"])
    assert "no such file" in str(exc)


# ---------------------------------------------------------------------------------------------
# exact mode: one declaration, every surface (issue 42)


def test_exact_mode_reaches_every_surface(cli):
    """``rows_match`` is declared once and reaches each surface the table feeds: the flag of
    generate, chat and serve; the chat's settings (F2); a Modelfile PARAMETER; a request field of
    /v1 (chat, completions and responses) and an option of Ollama's /api, both refusing a value that is not a
    boolean with a 400 naming it; and the GenerationConfig of a request, whose field overrides the
    server's default both ways."""
    from localspec.server.ollama.params import read_options
    from localspec.server.openai.responses import chat_body
    from localspec.server.schemas import ResponsesRequest
    from localspec.server.params import ServeDefaults, generation_config

    opt = OPTIONS["rows_match"]
    assert (opt.flag, opt.parameter, opt.field) == ("--rows-match/--no-rows-match", "rows_match", "rows_match")
    for command in ("generate", "chat", "serve"):
        assert any(o.name == "rows_match" for o, _ in _declared_params(cli.commands[command])), command
    assert ChatSettings(rows_match=True).config(True).rows_match is True
    assert ChatSettings().config(True).rows_match is None   # off: the engine's default, which is off
    assert check_parameter("rows_match", "true") is True and check_parameter("rows_match", "false") is False
    with pytest.raises(ValueError, match="PARAMETER rows_match "):
        check_parameter("rows_match", "2")
    for schema in (ChatCompletionRequest, CompletionRequest):
        assert _request("rows_match", True, schema).rows_match is True
        with pytest.raises(pydantic.ValidationError):
            _request("rows_match", "yes", schema)   # a strict boolean, as recall
    responses = ResponsesRequest.model_validate({"input": "hi", "rows_match": True})
    assert chat_body(responses).rows_match is True   # /v1/responses passes it to the chat it asks for
    with pytest.raises(pydantic.ValidationError):
        ResponsesRequest.model_validate({"input": "hi", "rows_match": "yes"})
    assert read_options({"rows_match": True}, 2048) == ({"rows_match": True}, {})
    with pytest.raises(APIError) as err:
        read_options({"rows_match": "maybe"}, 2048)
    assert err.value.status == 400 and err.value.param == "options.rows_match"
    for server_default, asked, want in ((False, None, None), (False, True, True), (True, None, True),
                                        (True, False, None)):
        defaults = ServeDefaults(n_ctx=2048, rows_match=server_default)
        config = generation_config(_request("rows_match", asked), defaults, None)
        assert config.rows_match is want, (server_default, asked)
    with pytest.raises(LocalspecError, match="rows_match"):
        GenerationConfig(rows_match="yes")
