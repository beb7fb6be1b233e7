"""Hardening, third round (issue 36), one test per class of hostile input:

- grammars bounded before llama.cpp parses them (its parser recurses per nested group and
  segfaulted at 100,000; an enum of 100,000 strings stalled every slot): refused with one
  ``Error:`` line on the CLI, 400 naming the field on the server;
- one request's failure contained to that request: a grammar that matches nothing, sent while
  another client streams, fails the sender only; the stream goes on unchanged;
- the prompt cache's bookkeeping cannot be left half-done (A, B, A with room for one text);
- llama.cpp's limits checked before it is called: tokenizer kinds that abort it;
- tracebacks turned into one ``Error:`` line: drafter metadata of the wrong kind, config.json
  values of the wrong kind, files too large to read, host names the IDNA codec refuses;
- the API key: empty or not visible ASCII, refused at start;
- ``inspect --json`` is strict JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from cli_run import LOCALSPEC, assert_one_error, cli_batch, default_sigint, one_error_cli as cli, works
from serve_checks import Served, error_of
from tiny_models import build_drafter, build_target, repeat_pair, rewrite_gguf

U32 = gguf.GGUFValueType.UINT32
STR = gguf.GGUFValueType.STRING
F32 = gguf.GGUFValueType.FLOAT32
DEEP = 100_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    return d, *repeat_pair(d)


# -- grammars: bounded before llama.cpp parses them ----------------------------------------------------
def _schemas(d: Path) -> dict[str, Path]:
    cases = {
        "maxlength": {"type": "string", "maxLength": DEEP},
        "maxitems": {"type": "array", "items": {"type": "integer"}, "maxItems": DEEP},
        "enum": {"enum": [f"w{i}" for i in range(DEEP)]},
        "deep": {},
    }
    for _ in range(100):   # arrays of arrays, 100 deep (200 JSON levels)
        cases["deep"] = {"type": "array", "items": cases["deep"]}
    out = {}
    for name, schema in cases.items():
        out[name] = d / f"{name}.json"
        out[name].write_text(json.dumps(schema))
    out["nested-text"] = d / "nested.json"      # arrays nested 100,000 deep: json.loads itself recurses
    out["nested-text"].write_text("[" * DEEP + "]" * DEEP)
    return out


def test_grammars_beyond_the_limits_are_one_error_line_before_the_model_loads(tiny, tmp_path):
    """--json-schema and --grammar beyond what llama.cpp's grammar code takes: one Error line, fast,
    the process alive (llama.cpp segfaulted on 100,000 nested groups; the enum stalled for minutes)."""
    d, target, _ = tiny
    schemas = _schemas(tmp_path)
    deep_gbnf = tmp_path / "deep.gbnf"
    deep_gbnf.write_text("root ::= " + "(" * DEEP + '"a"' + ")" * DEEP + "\n")
    chain = tmp_path / "chain.gbnf"
    chain.write_text("root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "x"\n' for i in range(5000)) + 'r5000 ::= "a"\n')
    alternatives = tmp_path / "alts.gbnf"
    alternatives.write_text("root ::= " + " | ".join(f'"w{i}"' for i in range(5000)) + "\n")
    repeats = tmp_path / "repeats.gbnf"
    repeats.write_text("root ::= " + " ".join(['"a"{0,2000}'] * 100) + "\n")
    huge = tmp_path / "huge.gbnf"
    huge.write_text('root ::= "' + "a" * (2 << 20) + '"\n')
    expected = [(["--json-schema", str(schemas["maxlength"])], "maxLength 100000 is more than the"),
                (["--json-schema", str(schemas["maxitems"])], "maxItems 100000 is more than the"),
                (["--json-schema", str(schemas["enum"])], "enum lists 100000 values"),
                (["--json-schema", str(schemas["deep"])], "nests more than"),
                (["--json-schema", str(schemas["nested-text"])], "nested too deeply"),
                (["--grammar", str(deep_gbnf)], "nests groups 100000 deep"),
                (["--grammar", str(chain)], "has 5002 rules"),
                (["--grammar", str(alternatives)], "offers 4999 alternatives"),
                (["--grammar", str(repeats)], "repeats items 200000 times"),
                (["--grammar", str(huge)], "bytes long")]
    procs = cli_batch(*(["generate", "--target", str(target), "-p", "hi", "--raw", "-n", "3", *flags]
                        for flags, _ in expected))
    for (flags, message), proc in zip(expected, procs):
        line = assert_one_error(proc, contains=message)
        assert flags[0] in line and proc.seconds < 30, (flags, line, proc.seconds)
    works(target)


def test_a_grammar_within_the_limits_still_runs(tiny, tmp_path):
    """The limits leave real grammars alone: a schema of the converter's usual shape, a bounded string."""
    _, target, _ = tiny
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 200}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                                 "maxItems": 50}}, "required": ["name"]}))
    proc = cli("generate", "--target", str(target), "-p", "hi", "--raw", "-n", "4", "--json-schema", str(schema))
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- tracebacks: one Error line --------------------------------------------------------------------------
DRAFTER_DAMAGE = [
    ({"eagle3.attention.head_count_kv": (0, U32)}, None, "cannot be shared by 0 KV heads"),
    ({"eagle3.feed_forward_length": ("wide", STR)}, None, "feed_forward_length must be an integer"),
    ({"eagle3.attention.layer_norm_rms_epsilon": ("tiny", STR)}, None, "must be a positive finite number"),
    ({"localspec.eagle.fc_norm_eps": (float("nan"), F32)}, None, "fc_norm_eps must be a positive finite number"),
    ({"localspec.eagle.source": (float("nan"), F32)}, None, "localspec.eagle.source must be text"),
    ({}, "d2t", "d2t maps"),
]


def _damaged(drafter: Path, d: Path, i: int, changes: dict, tensor: str | None) -> Path:
    tensors = None
    if tensor == "d2t":   # a d2t whose last entry points past the 49152-token vocabulary
        from localspec.llama.gguf_native import GGUFHeader
        d2t = GGUFHeader(drafter).tensor_data("d2t").astype(np.int64).copy()
        d2t[-1] = 10 ** 6
        tensors = {"d2t": d2t}
    return rewrite_gguf(drafter, d / f"bad{i}.gguf", changes, tensors)


@pytest.fixture(scope="module")
def reduced_drafter(tiny):
    """A drafter with a d2t (a reduced vocabulary of 700 tokens), as real ones have."""
    d, target, _ = tiny
    return build_drafter(d / "reduced.gguf", target, "repeat", d2t=np.arange(0, 7000, 10))


def test_damaged_drafter_metadata_is_one_error_line_in_export_generate_and_inspect(tiny, reduced_drafter, tmp_path):
    """Every metadata value is checked for its kind in one place (gguf_info.read_gguf): export,
    generate and inspect --json of a damaged drafter say what is wrong in one line (they raised
    ZeroDivisionError, ValueError, IndexError, or printed NaN)."""
    _, target, _ = tiny
    commands, messages = [], []
    for i, (changes, tensor, message) in enumerate(DRAFTER_DAMAGE):
        bad = _damaged(reduced_drafter, tmp_path, i, changes, tensor)
        commands += [["export", str(bad), "--format", "specforge", "-o", str(tmp_path / f"out{i}")],
                     ["generate", "--target", str(target), "--draft", str(bad), "-p", "hi", "--raw", "-n", "3"]]
        messages += [message, message]
        if "must be" in message:   # a value of the wrong kind (inspect describes, it does not check sizes)
            commands.append(["inspect", "--json", str(bad)])
            messages.append(message)
    for args, message, proc in zip(commands, messages, cli_batch(*commands)):
        assert_one_error(proc, contains=message)
        assert "NaN" not in proc.stdout, (args, proc.stdout)
        assert not any(p.name.startswith("out") for p in tmp_path.iterdir() if p.is_dir()), args


def test_inspect_json_is_strict_json(tiny, reduced_drafter):
    """Whatever a file holds, inspect --json prints what strict parsers take (no NaN, no Infinity)."""
    _, target, _ = tiny
    for path in (target, reduced_drafter):
        proc = cli("inspect", "--json", str(path))
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"{c} in {proc.stdout}"))


CONFIG_DAMAGE = [
    ({"rms_norm_eps": "tiny"}, "'rms_norm_eps' must be a positive finite number"),
    ({"rope_scaling": "linear"}, "'rope_scaling' must be an object"),
    ({"max_position_embeddings": 1e30}, "'max_position_embeddings' must be a positive integer"),
    ({"max_position_embeddings": 2 ** 40}, "'max_position_embeddings' must be a positive integer"),
    ({"rope_theta": float("nan")}, "'rope_theta' must be a positive finite number"),
    ({"hidden_size": "64"}, "'hidden_size' must be a positive integer"),
    ({"architectures": 5}, "'architectures' must be a list"),
]


def test_config_values_of_the_wrong_kind_are_one_error_line_in_convert(tiny, reduced_drafter, tmp_path):
    """Every config.json value a layout reads is checked for its kind in one place
    (converters.checkpoint): convert says which key in one line (it raised ValueError,
    AttributeError, struct.error)."""
    from layout_writers import write_layout
    from localspec.converters.gguf_reader import read_drafter_gguf

    _, target, _ = tiny
    commands = []
    for i, (change, _) in enumerate(CONFIG_DAMAGE):
        ckpt = write_layout("speculators", read_drafter_gguf(reduced_drafter), tmp_path / f"ck{i}", dtype="float32",
                            target_n_layer=4)
        config = json.loads((ckpt / "config.json").read_text())
        config.update(change)
        (ckpt / "config.json").write_text(json.dumps(config))
        commands.append(["convert", str(ckpt), "--target", str(target), "-o", str(tmp_path / f"d{i}.gguf")])
    for (change, message), proc in zip(CONFIG_DAMAGE, cli_batch(*commands)):
        assert_one_error(proc, contains=message)
    assert not list(tmp_path.glob("d*.gguf"))


def test_files_too_large_are_refused_before_a_byte_is_read(tiny, tmp_path):
    """A 12 GiB sparse file as --prediction, --grammar, create -f or bench --prompts: one Error line
    from its size (all were read whole first: MemoryError, or the machine's memory)."""
    _, target, _ = tiny
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as fh:
        fh.truncate(12 << 30)
    gen = ["generate", "--target", str(target), "-p", "hi", "--raw", "-n", "2"]
    commands = [[*gen, "--prediction", str(huge)], [*gen, "--grammar", str(huge)], [*gen, "--json-schema", str(huge)],
                ["create", "big", "-f", str(huge)], ["bench", "--target", str(target), "--prompts", str(huge)]]
    for args, proc in zip(commands, cli_batch(*commands)):
        line = assert_one_error(proc, contains="12.0 GiB is more than")
        assert proc.seconds < 20, (args, proc.seconds)
        assert str(huge) in line, line


def test_a_host_name_the_idna_codec_refuses_is_one_error_line(tiny):
    _, target, _ = tiny
    proc = cli("serve", "--target", str(target), "--host", "ex..ample", "--port", "0")
    assert_one_error(proc, contains="--host 'ex..ample' is not a valid host name")


# -- llama.cpp's limits checked before it is called -------------------------------------------------------
def test_tokenizer_kinds_llama_cpp_aborts_on_are_refused(tiny, tmp_path):
    """tokenizer.ggml.model "llama" (SentencePiece) over a BPE vocabulary threw std::out_of_range
    through the C API at the first prompt (exit 134); "none" with a vocabulary asserted. Both are
    one Error line now, from the header, before llama.cpp loads the file."""
    _, target, _ = tiny
    spm = rewrite_gguf(target, tmp_path / "spm.gguf", {"tokenizer.ggml.model": ("llama", STR)})
    none = rewrite_gguf(target, tmp_path / "none.gguf", {"tokenizer.ggml.model": ("none", STR)})
    commands = [["generate", "--target", str(path), "-p", "hello world", "--raw", "-n", "2"] for path in (spm, none)]
    spm_proc, none_proc = cli_batch(*commands)
    assert_one_error(spm_proc, contains="byte fallback needs the tokens <0x00>..<0xFF>")
    assert_one_error(none_proc, contains="has no tokenizer")


# -- the API key --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, message", [(b"", "--api-key is empty"), (b"sk-\xff\xfe", "visible ASCII"),
                                          (b"sk key", "visible ASCII")], ids=["empty", "not-utf8", "space"])
def test_an_api_key_no_client_could_send_is_refused_at_start(tiny, key, message):
    """An empty key let an empty Bearer token in; a byte that is not UTF-8 made every request a 500."""
    _, target, _ = tiny
    proc = subprocess.run([*(a.encode() for a in LOCALSPEC), b"serve", b"--target", str(target).encode(), b"--port",
                           b"0", b"--host", b"0.0.0.0", b"--api-key", key], capture_output=True, timeout=120,
                          preexec_fn=default_sigint)
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))
    assert_one_error(proc, contains=message)


# -- one request's failure is that request's only: two real clients, the real server -------------------
HI = [{"role": "user", "content": "Hi"}]
LONG = {"prompt": "1, 2, 3, 4,", "max_tokens": 800, "temperature": 0}


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(parameters: dict) -> list:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


# (body, the field the 400 names): each sent while another client streams
BAD_REQUESTS = [
    ({"messages": HI, "response_format": _schema_format({"type": "string", "pattern": "^[b-a]$"})},
     "response_format"),                                  # a pattern of no character: '"', then nothing
    ({"messages": HI, "response_format": _schema_format({"type": "string", "maxLength": DEEP})}, "response_format"),
    ({"messages": HI, "response_format": _schema_format({"enum": [f"w{i}" for i in range(5000)]})},
     "response_format"),                                  # past the grammar's 1000 choices, under the body's 10,000 items
    ({"messages": HI, "tool_choice": "required",
      "tools": _tool({"type": "object", "properties": {"a": {"type": "array", "maxItems": DEEP}}})}, "tools"),
]


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory):
    home = tmp_path_factory.mktemp("limits_home")
    target = build_target(home / "tiny.gguf", "repeat")
    served = Served(home, "--target", str(target), "--ctx", "4096", "--parallel", "2", "--no-spec",
                    "--max-body", "8M")
    yield served
    assert served.stop() == 130
    assert "Traceback" not in served.text(), served.text()


def _stream(url: str, body: dict, out: dict) -> None:
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        out["status"], out["lines"], out["times"] = r.status_code, [], []
        for line in r.iter_lines():
            if line:
                out["lines"].append(line)
                out["times"].append(time.monotonic())


def _text(out: dict) -> str:
    assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]", out.get("lines", [])[-3:]
    chunks = [json.loads(line[len("data: "):]) for line in out["lines"][:-1]]
    assert all("error" not in c for c in chunks), chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    return "".join(c["choices"][0]["text"] for c in chunks)


@pytest.fixture(scope="module")
def long_alone(two_slots) -> str:
    """LONG's text streamed alone (greedy, no drafting: the same on every request), once a module."""
    alone: dict = {}
    _stream(two_slots.url, LONG, alone)
    return _text(alone)


def test_a_bad_grammar_fails_its_sender_only_while_another_client_streams(two_slots, long_alone):
    """Each bad request above, sent while a long stream runs: a 400 naming the field its grammar
    came from, at once; the stream goes on and ends complete, its text the same as alone (the
    unmatchable grammar used to end every running stream with the sender's error)."""
    url = two_slots.url
    expected = long_alone
    for body, param in BAD_REQUESTS:
        streaming: dict = {}
        thread = threading.Thread(target=_stream, args=(url, LONG, streaming))
        thread.start()
        deadline = time.monotonic() + 60
        while len(streaming.get("lines", [])) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        answered = time.monotonic()
        thread.join(timeout=300)
        assert r.status_code == 400, (param, r.text[:300])
        error = error_of(r)
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert _text(streaming) == expected, param
        assert answered < streaming["times"][-1], "the bad request was not answered while the stream ran"
    assert two_slots.health()["requests_processing"] == 0


def test_a_grammar_that_dies_midway_ends_its_own_stream_only(two_slots, long_alone):
    """A grammar that allows a first token and then none: the sender's stream ends with an error
    event naming response_format; the other stream is unchanged and complete."""
    url = two_slots.url
    streaming: dict = {}
    thread = threading.Thread(target=_stream, args=(url, LONG, streaming))
    thread.start()
    while len(streaming.get("lines", [])) < 3:
        time.sleep(0.02)
    body = {"messages": HI, "stream": True, "max_tokens": 20,
            "response_format": _schema_format({"type": "string", "pattern": "^a[b-a]$"})}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line]
    thread.join(timeout=300)
    assert lines[-1] == "data: [DONE]", lines
    error = json.loads(lines[-2][len("data: "):])["error"]
    assert error["param"] == "response_format" and "allows no token" in error["message"], error
    assert _text(streaming) == long_alone


# -- the scheduler's bookkeeping: never half-done --------------------------------------------------------
def _collect():
    events: list = []
    return events, events.append


def _drain(scheduler) -> None:
    while scheduler.active:
        scheduler.step()


def test_the_prompt_cache_holding_one_text_serves_a_b_a(tiny):
    """One slot, a cache with room for one text, prompts A, B, A: keeping B used to evict A while A
    was being loaded (KeyError in PromptCache.touch), leaving a half-admitted slot whose next step
    failed (TypeError). Now A is taken out of the cache as it is loaded: all three run, and the
    second A reads its prompt back from the cache."""
    from localspec import DoneEvent, Engine, GenerationConfig
    from localspec.runtime.prompt_cache import PromptCache

    _, target, _ = tiny
    a = [100 + i % 97 for i in range(330)]
    b = [2000 + i % 89 for i in range(330)]
    config = GenerationConfig(max_tokens=4, spec=False)
    with Engine(target, n_ctx=1024) as engine:
        one = len(engine.ctx.seq_state(0) or b"") or 1   # an empty sequence's state: the floor
        scheduler = engine.scheduler()
        events, sink = _collect()
        scheduler.admit(a, config, None, sink)
        _drain(scheduler)
        size = len(engine.ctx.seq_state(0))
        assert size > one
        scheduler = engine.scheduler(prompt_cache=PromptCache(size + size // 2))   # room for one text
        engine.verifier.forget()
        done = []
        for prompt in (a, b, a):
            events, sink = _collect()
            scheduler.admit(prompt, config, None, sink)
            _drain(scheduler)
            done.append(next(e for e in events if isinstance(e, DoneEvent)))
        assert [d.finish_reason for d in done] == ["length"] * 3
        assert done[2].stats.prompt_cached == len(a) - 1 and done[2].tokens == done[0].tokens
        assert len(scheduler.prompt_cache) == 1 and scheduler.prompt_cache.used <= scheduler.prompt_cache.budget


def test_a_request_that_fails_to_start_leaves_its_slot_free(tiny):
    """A failure while a slot is being taken (a grammar llama.cpp refuses) leaves no half-admitted
    slot and no locked engine: the next request runs."""
    from localspec import DoneEvent, Engine, GenerationConfig
    from localspec.core.errors import GrammarError

    _, target, _ = tiny
    with Engine(target, n_ctx=256, parallel=2) as engine:
        scheduler = engine.scheduler()
        with pytest.raises(GrammarError):
            scheduler.admit([1, 2, 3], GenerationConfig(max_tokens=2, grammar="root ::= ("), None, print)
        assert scheduler.active == 0 and not engine._lock.locked()
        events, sink = _collect()
        scheduler.admit([1, 2, 3], GenerationConfig(max_tokens=2, spec=False), None, sink)
        _drain(scheduler)
        assert any(isinstance(e, DoneEvent) for e in events)


def test_one_slots_failure_is_that_slots_only(tiny):
    """Two slots; one's grammar allows a first token and then none: that slot ends with SlotFailed
    (the grammar's error), the other's output is the one it gets alone."""
    from localspec import DoneEvent, Engine, GenerationConfig
    from localspec.core.errors import GrammarError
    from localspec.runtime.scheduler import SlotFailed

    _, target, _ = tiny
    prompt = [100 + i for i in range(20)]
    plain = GenerationConfig(max_tokens=40, spec=False)
    dying = GenerationConfig(max_tokens=40, spec=False, grammar='root ::= "a" [b-a]')
    with Engine(target, n_ctx=256, parallel=2) as engine:
        scheduler = engine.scheduler()
        alone, sink = _collect()
        scheduler.admit(prompt, plain, None, sink)
        _drain(scheduler)
        engine.clear_cache()
        for slot in scheduler.slots:
            slot.verifier.forget()
        together, sink = _collect()
        failing, fail_sink = _collect()
        scheduler.admit(prompt, plain, None, sink)
        scheduler.admit([7, 8, 9], dying, None, fail_sink)
        _drain(scheduler)
    assert isinstance(failing[-1], SlotFailed) and isinstance(failing[-1].error, GrammarError), failing[-3:]
    assert not any(isinstance(e, DoneEvent) for e in failing)
    first = next(e for e in alone if isinstance(e, DoneEvent))
    second = next(e for e in together if isinstance(e, DoneEvent))
    assert second.tokens == first.tokens and second.finish_reason == "length"


def test_a_server_of_more_slots_than_the_drafters_batch_starts_and_answers(tiny, tmp_path):
    """serve --parallel 65..256 with a drafter aborted before it listened (the drafter's context,
    an eagle3 'encoder' to llama.cpp, gets n_batch logit rows and reserves one per sequence): its
    batch is now as large as the slots. Up to 129 slots run (the target's logit rows, sized for a
    verify batch); more are one Error line saying so."""
    _, target, drafter = tiny
    proc = cli("serve", "--target", str(target), "--draft", str(drafter), "--parallel", "256", "--ctx", "64",
               "--port", "0")
    assert_one_error(proc, contains="256 slots are more than the 129 logit rows")
    served = Served(tmp_path, "--target", str(target), "--draft", str(drafter), "--parallel", "129", "--ctx", "64")
    try:
        r = httpx.post(served.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "temperature": 0},
                       timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    finally:
        assert served.stop() == 130
    assert "GGML_ASSERT" not in served.text() and "Traceback" not in served.text()
