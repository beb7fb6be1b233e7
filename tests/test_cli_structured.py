"""`localspec generate --json-schema / --grammar / --logprobs / --prediction`: the output and the
one-line errors with their exit codes (the process boundary is the point)."""

from __future__ import annotations

import json

import pytest

from cli_run import cli

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_json_schema_logprobs_and_prediction_in_the_json_output(tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    prediction = tmp_path / "prediction.txt"
    prediction.write_text('{ "name": "Ava", "age": 25 }')
    proc = cli("generate", "-p", "Give me a person.", "-n", "60", "--json-schema", str(schema), "--json",
               "--logprobs", "2", "--prediction", str(prediction))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    value = json.loads(out["text"])
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    assert len(out["logprobs"]) == out["n_tokens"]
    assert "".join(lp["token"] for lp in out["logprobs"]) == out["text"]
    assert all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in out["logprobs"])
    assert out["accepted_prediction_tokens"] + out["rejected_prediction_tokens"] > 0


def test_a_grammar_file_constrains_the_text(tmp_path):
    gbnf = tmp_path / "yn.gbnf"
    gbnf.write_text('root ::= "yes" | "no"')
    proc = cli("generate", "-p", "Is the sky blue?", "-n", "8", "--grammar", str(gbnf), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] in ("yes", "no")


@pytest.mark.parametrize("files,args,message", [
    ({"g.gbnf": "root ::= foo"}, ["--grammar", "g.gbnf"], "Undefined rule identifier 'foo'"),
    ({"g.gbnf": ""}, ["--grammar", "g.gbnf"], "the grammar is empty"),
    ({"s.json": "{bad"}, ["--json-schema", "s.json"], "is not JSON"),
    ({"s.json": '{"type": "foo"}'}, ["--json-schema", "s.json"], "cannot be turned into a grammar"),
    ({}, ["--grammar", "missing.gbnf"], "cannot read"),
    ({}, ["--prediction", "missing.txt"], "cannot read"),
    ({"p.txt": b"\xff\xfe"}, ["--prediction", "p.txt"], "not UTF-8"),
    ({}, ["--json", "--logprobs", "21"], "--logprobs"),
    ({"g.gbnf": 'root ::= "a"', "s.json": "{}"}, ["--grammar", "g.gbnf", "--json-schema", "s.json"], "exclude"),
])
def test_bad_structured_inputs_are_one_error_line(tmp_path, files, args, message):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    args = [str(tmp_path / a) if a.endswith((".gbnf", ".json", ".txt")) else a for a in args]
    proc = cli("generate", "-p", "hi", "-n", "3", *args)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]


def test_logprobs_without_json_is_a_usage_error():
    proc = cli("generate", "-p", "hi", "-n", "3", "--logprobs", "2")
    assert proc.returncode == 2 and "--json" in proc.stderr
