"""Hardening, fourth round (issue 44), class 3: one name rule, matched as a whole string.

A name ending in a newline (``$`` matches before one) or holding one is refused by the CLI
(``create``, ``pull``, ``rm``: one ``Error:`` line, nothing written), the store (records, their
``name`` field, the catalog, the locks) and both APIs (``/api/create``, ``/api/copy``,
``/api/delete``, ``/api/pull``, a request's ``model``); and no module but ``core/names.py`` spells
a name pattern.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from cli_run import assert_one_error, one_error_cli
from serve_checks import Served
from tiny_models import build_target

from localspec.core.errors import LocalspecError
from localspec.core.names import check_model_name, is_model_name
from localspec.store import registry

BAD = ["tiny\n", "tiny\r\n", "\ntiny", "ti\nny", "tiny ", "tiny.gguf", "", "-tiny", "a" * 101, "ti/ny", "..",
       "tiny\x00", "tïny"]
GOOD = ["tiny", "Tiny-2.5_b", "a" * 100, "0"]


@pytest.mark.parametrize("name", BAD)
def test_the_rule_refuses_a_name_as_a_whole(name):
    assert not is_model_name(name)
    with pytest.raises(LocalspecError) as info:
        check_model_name(name)
    assert "\n" not in str(info.value)   # the name is quoted with its control characters escaped
    assert registry.load(name) is None
    with pytest.raises(LocalspecError):
        registry.check_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_the_rule_takes_a_good_name(name):
    assert is_model_name(name) and check_model_name(name) == name


def test_a_record_whose_name_breaks_the_rule_is_damaged(isolated_home):
    good = registry.UserModel(name="tiny", target="/x.gguf")
    with pytest.raises(Exception):
        registry.UserModel(name="tiny\n", target="/x.gguf")
    d = registry.models_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "tiny.json").write_text(json.dumps({**good.model_dump(mode="json"), "name": "tiny\n"}))
    valid, damaged, _ = registry.scan()
    assert not valid and [n for n, _ in damaged] == ["tiny"]


def test_the_cli_refuses_a_name_with_a_newline(tmp_path):
    target = build_target(tmp_path / "tiny.gguf")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {target}\n")
    env = {"LOCALSPEC_HOME": str(tmp_path / "home")}
    for args in (["create", "tiny\n", "-f", str(modelfile)], ["pull", "tiny\n"], ["rm", "tiny\n"]):
        proc = one_error_cli(*args, env=env)
        assert "invalid model name 'tiny\\n'" in assert_one_error(proc), proc.stderr
    records = tmp_path / "home" / "models"
    assert not records.exists() or not list(records.glob("*.json"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("names_home")
    target = build_target(home / "tiny.gguf")
    served = Served(home, "--target", str(target), "--ctx", "256", "--no-spec")
    served.home, served.target = home, target
    yield served
    assert served.stop() == 130
    assert "Traceback" not in served.text(), served.text()


def test_ollama_s_routes_refuse_a_name_with_a_newline(server):
    url, target = server.url, str(server.target)
    calls = [("/api/create", {"model": "tiny\n", "from": target}),
             ("/api/create", {"model": "tiny:latest\n", "from": target}),
             ("/api/copy", {"source": "tiny.gguf", "destination": "copy\n"}),
             ("/api/pull", {"model": "smollm2-135m\n", "stream": False})]
    for path, body in calls:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 400 and set(r.json()) == {"error"}, (path, r.text)
        assert "invalid model name" in r.json()["error"] and "\n" not in r.json()["error"], r.text
    r = httpx.request("DELETE", url + "/api/delete", json={"model": "tiny\n"}, timeout=60)
    assert r.status_code == 400 and "invalid model name" in r.json()["error"], r.text
    assert not list((server.home / "models").glob("*.json"))


def test_a_request_naming_a_model_with_a_newline_is_a_404(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "smollm2-135m\n", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert "\n" not in r.json()["error"]["message"]


def test_no_module_but_core_names_spells_a_name_pattern():
    package = Path(__file__).resolve().parents[1] / "localspec"
    pattern = re.compile(r"NAME_RE\b|\{0,99\}")   # the rule: a first character, then up to 99 more
    spelled = [str(p.relative_to(package)) for p in package.rglob("*.py") if pattern.search(p.read_text())]
    assert spelled == ["core/names.py"], spelled
