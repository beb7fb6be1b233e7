"""The first request of a fresh 4-slot server drafts where its text copies its prompt (issue 45).

The report: with 4 slots the first request after a start drafted nothing on a copy prompt, and
the second drafted 32 tokens. Measured (docs/speculation.md, "The first request"): one slot and
four behave alike, with no per-slot cold state. The second request drafts from recall, the first
request's whole answer. The first drafts only where its own text copies the prompt for 4+ tokens,
because shorter matches do not pay under the policy's first-generation priors. Here the server
starts with no calibration (the provisional prior cost model, as on a fresh machine) and the
answer copies the prompt's system text: its first request must draft and have drafts accepted.
"""

from __future__ import annotations

import pytest

from serve_checks import KEY, running_server

PROMPT = ("Repeat the following list exactly, one item per line:\napple\nbanana\ncherry\ndate\nelderberry\nfig\n"
          "grape\nhoneydew\nkiwi\nlemon\nmango\nnectarine")


def test_a_copy_prompt_drafts_on_the_first_request_of_a_four_slot_server(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_CALIBRATION", "off")   # the prior cost model, as before a first calibration
        with running_server(tmp_path, "--parallel", "4", "--ctx", "512", "--api-key", KEY) as server:
            response = server.http.post("/v1/chat/completions", timeout=600, json={
                "model": "smollm2-135m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
                "temperature": 0.0, "repeat_penalty": 1.0})
    assert response.status_code == 200, response.text
    speculative = response.json()["usage"]["speculative"]
    assert speculative["drafted"] > 0 and speculative["accepted"] > 0, speculative
