"""A vocabulary that lists a token string twice is refused before llama.cpp sees it.

llama.cpp's vocabulary loader asserts that every token string is distinct
(``GGML_ASSERT(id_to_token.size() == token_to_id.size())``) and aborts the process; a header
byte flipped in a token's length (found by tests/test_fuzz.py) makes exactly such a file."""

from __future__ import annotations

import os
import subprocess
import sys

import gguf
import pytest

from localspec.core.errors import LocalspecError
from localspec.formats import gguf_consts as K
from localspec.formats.gguf_info import read_gguf
from localspec.llama.gguf_native import GGUFHeader
from tiny_models import build_target, rewrite_gguf


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    target = build_target(d / "t.gguf", "repeat")
    tokens = list(GGUFHeader(target).string_arrays[K.KEY_TOKENIZER_TOKENS])
    tokens[301] = tokens[300]
    bad = rewrite_gguf(target, d / "twice.gguf",
                       {K.KEY_TOKENIZER_TOKENS: (tokens, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)})
    return target, bad, tokens[300]


def test_read_gguf_names_the_repeated_token(twice):
    target, bad, token = twice
    read_gguf(target)
    with pytest.raises(LocalspecError, match=f"lists the token '{token}' twice"):
        read_gguf(bad)


def test_generate_refuses_it_with_one_line(twice):
    _, bad, token = twice
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", "--target", str(bad), "--no-spec",
                           "-n", "2", "--prompt", "hi"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LOCALSPEC_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: {bad}: its vocabulary lists the token '{token}' twice"]
