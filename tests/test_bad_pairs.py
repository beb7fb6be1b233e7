"""Pairs llama.cpp aborts on (GGML_ASSERT, exit 134) rather than reports (issue 29): every such
assumption of its loader and first decode is checked in localspec before the files reach it.

Each bad GGUF is built here from the tiny models, with the tensors it names reshaped so that
llama.cpp's own shape checks pass and only its assertion would be left; the CLI runs as a
subprocess: one ``Error:`` line, exit 1, no traceback, no native abort, and the good pair still runs.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from localspec import LocalspecError
from localspec.formats.gguf_info import check_pair, read_gguf
from localspec.llama.gguf_native import GGUFHeader
from cli_run import assert_one_error, one_error_cli as cli, works
from tiny_models import HEAD_DIM, N_HEAD_KV, N_LAYER, build_drafter, build_target, rewrite_gguf

U32 = gguf.GGUFValueType.UINT32
STR = gguf.GGUFValueType.STRING
HALF = HEAD_DIM // 2


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    target = build_target(d / "t.gguf", "repeat")
    d2t = np.arange(0, 2000, 2)
    drafter = build_drafter(d / "d.gguf", target, "repeat", d2t=d2t)
    return d, target, drafter


def _cast(path, pick, dtype) -> dict:
    h = GGUFHeader(path)
    return {n: h.tensor_data(n).astype(dtype) for n in h.tensors if pick(n)}


def _halve_v(path, names) -> dict:
    h = GGUFHeader(path)
    return {n: h.tensor_data(n)[: N_HEAD_KV * HALF] for n in names}


TARGET_V = [f"blk.{i}.attn_v.weight" for i in range(N_LAYER)]

# (which file is bad, metadata changes, tensor changes(path) -> dict, what the line says)
CASES = {
    "d2t stored as I32": ("draft", {}, lambda p: _cast(p, lambda n: n == "d2t", np.int32), "d2t must be a one-dimensional I64"),
    "d2t stored as F32": ("draft", {}, lambda p: _cast(p, lambda n: n == "d2t", np.float32), "d2t must be a one-dimensional I64"),
    "drafter value head != key head": ("draft", {"eagle3.attention.value_length": (HALF, U32)},
                                       lambda p: _halve_v(p, ["blk.0.attn_v.weight"]), "value head size 8 differs"),
    "drafter key_length only": ("draft", {"eagle3.attention.key_length": (HALF, U32),
                                          "eagle3.rope.dimension_count": (HALF, U32)}, lambda p: {},
                                "value head size 16 differs from key head size 8"),
    "target value head != key head": ("target", {"llama.attention.value_length": (HALF, U32)},
                                      lambda p: _halve_v(p, TARGET_V), "value head size 8 differs"),
    "target rope narrower than its head": ("target", {"llama.rope.dimension_count": (HALF, U32)}, lambda p: {},
                                           "rope.dimension_count 8 must equal the head size 16"),
    "drafter norm in F16": ("draft", {}, lambda p: _cast(p, lambda n: "norm" in n, np.float16), "in F32"),
    "target norm in F16": ("target", {}, lambda p: _cast(p, lambda n: "norm" in n, np.float16), "in F32"),
    "target matrix of integers": ("target", {}, lambda p: _cast(p, lambda n: n == "blk.0.attn_q.weight", np.int32),
                                  "not a weight type"),
    "target experts without experts used": ("target", {"llama.expert_count": (4, U32)}, lambda p: {},
                                            "inconsistent expert counts"),
    "target unknown rope scaling": ("target", {"llama.rope.scaling.type": ("sideways", STR)}, lambda p: {},
                                    "rope.scaling.type 'sideways'"),
    "target too many layers": ("target", {"llama.block_count": (513, U32)}, lambda p: {}, "block_count must be between 1 and 512"),
    "drafter nextn beyond its layers": ("draft", {"eagle3.nextn_predict_layers": (2, U32)}, lambda p: {},
                                        "nextn_predict_layers 2 exceeds"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_pair_llama_cpp_would_abort_on_is_one_error_line(pair, tmp_path, case):
    d, target, drafter = pair
    which, changes, tensors, message = CASES[case]
    src = drafter if which == "draft" else target
    bad = rewrite_gguf(src, tmp_path / f"bad-{which}.gguf", changes, tensors(src))
    t, dr = (bad, drafter) if which == "target" else (target, bad)
    with pytest.raises(LocalspecError, match=message.replace("(", r"\(")) as info:
        check_pair(read_gguf(t), read_gguf(dr))
    assert "\n" not in str(info.value)
    proc = cli("generate", "--target", str(t), "--draft", str(dr), "-p", "hi", "--raw", "-n", "3")
    assert proc.returncode != 134, proc.stderr[-2000:]
    assert_one_error(proc, contains=message)
    if which == "target":   # a target llama.cpp aborts on is refused with no drafter too
        assert_one_error(cli("generate", "--target", str(t), "--no-spec", "-p", "hi", "-n", "3"), contains=message)


def test_the_good_pair_still_runs(pair):
    d, target, drafter = pair
    check_pair(read_gguf(target), read_gguf(drafter))
    works(target, "--draft", str(drafter))
