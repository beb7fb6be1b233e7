"""Targets whose layer metadata llama.cpp aborts on (GGML_ASSERT, a division by zero) rather than
reports, on plain decoding too (issue 44, class 5): NextN blocks against the tensors present, the
sliding and full layers each architecture's graph and cache assert on, shared-KV layers, hybrid
intervals (localspec.formats.layer_checks). Each hostile file is a tiny fixture rewritten with
``gguf``; ``generate`` and ``fit`` on it are one ``Error:`` line and exit 1, all of them in one
child process that a native abort would kill; ``inspect`` still describes it; the server answers
a request for it with a 400 and goes on.
"""

from __future__ import annotations

import dataclasses
import shutil

import gguf
import pytest

from cli_run import assert_one_error, cli_batch, run_cli
from gemma4_models import N_LAYER as G4_LAYERS, build_gemma4_target
from hybrid_models import build_hybrid_target
from localspec.core.errors import LocalspecError
from localspec.formats.gguf_info import check_target, mtp_heads, read_gguf
from mtp_models import build_mtp_target
from tiny_models import build_target, rewrite_gguf

U32, ARR, BOOL = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL
NEXTN = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("targets")
    return {"dir": d,
            "llama": build_target(d / "llama.gguf"),
            "step35": build_mtp_target(d / "step35.gguf", heads=2),           # trunk 0-1, heads 2-3
            "qwen35": build_hybrid_target(d / "qwen35.gguf", with_head=True),  # trunk 0-3, head 4
            "qwen35x2": build_hybrid_target(d / "qwen35x2.gguf", with_head=True, heads=2),
            "qwen35moe": build_hybrid_target(d / "qwen35moe.gguf", arch="qwen35moe"),
            "gemma4": build_gemma4_target(d / "gemma4.gguf"),
            "gemma4_shared1": build_gemma4_target(d / "gemma4-shared1.gguf", shared_kv_layers=1)}


# name: (base file, metadata changes, tensors dropped, what the line says)
CASES = {
    "nextn_all_blocks_step35": ("step35", {"step35.nextn_predict_layers": (4, U32)}, [],
                                "nextn_predict_layers 4 leaves none of its 4 blocks to the trunk"),
    "nextn_all_blocks_llama": ("llama", {"llama.nextn_predict_layers": (4, U32)}, [],
                               "nextn_predict_layers 4 leaves none of its 4 blocks"),
    "two_heads_one_present": ("step35", {}, [f"blk.2.{t}" for t in NEXTN],
                              "declares 2 NextN blocks (blk.2..blk.3) but the file lacks blk.2.nextn.eh_proj.weight"),
    "first_head_without_eh_proj": ("step35", {}, ["blk.2.nextn.eh_proj.weight"], "lacks blk.2.nextn.eh_proj.weight"),
    "qwen35_second_head_declared": ("qwen35", {"qwen35.nextn_predict_layers": (2, U32)}, [],
                                    "lacks blk.3.nextn.eh_proj.weight and 2 more"),
    "qwen35_two_heads": ("qwen35x2", {}, [], "nextn_predict_layers is 2: llama.cpp's qwen35 drafts with a single"),
    "step35_no_sliding_layer": ("step35", {"step35.attention.sliding_window_pattern": ([False] * 4, ARR, BOOL)}, [],
                                "marks none of its 4 layers as sliding"),
    "gemma4_no_sliding_layer": ("gemma4", {"gemma4.attention.sliding_window_pattern": ([False] * G4_LAYERS, ARR, BOOL)},
                                [], "marks none of its 4 layers as sliding"),
    "hybrid_interval_0": ("qwen35", {"qwen35.full_attention_interval": (0, U32)}, [],
                          "full_attention_interval is 0"),
    "moe_no_expert_used": ("qwen35moe", {f"qwen35moe.{k}": None for k in ("expert_count", "expert_used_count",
                                                                           "expert_feed_forward_length")}, [],
                           "qwen35moe.expert_used_count (of its first layer) is 0 or missing"),
    "llama_layer_without_heads": ("llama", {"llama.attention.head_count": ([4, 0, 4, 4], ARR, U32)}, [],
                                  "llama.attention.head_count must not be 0 for a layer"),
    "delta_net_heads": ("qwen35", {"qwen35.ssm.group_count": (3, U32)}, [], "must be a positive multiple of"),
    "gemma4_all_layers_shared": ("gemma4", {"gemma4.attention.shared_kv_layers": (G4_LAYERS, U32)}, [],
                                 "shared_kv_layers 4 leaves 0 of its 4 layers with a KV cache of their own"),
    "gemma4_three_shared": ("gemma4", {"gemma4.attention.shared_kv_layers": (3, U32)}, [], "leaves 1 of its 4"),
    "gemma4_reuse_of_another_kind": ("gemma4_shared1", {}, [],
                                     "layer 3 (full) would reuse the KV of layer 2, which is not full"),
}


def _hostile(good, name):
    base, changes, dropped, _ = CASES[name]
    dst = good["dir"] / f"bad-{name}.gguf"
    if not dst.exists():
        rewrite_gguf(good[base], dst, changes, {t: None for t in dropped})
    return dst


def test_the_fixtures_themselves_pass_the_checks(good):
    for name in ("llama", "step35", "qwen35", "qwen35moe", "gemma4"):
        check_target(read_gguf(good[name]))
    assert mtp_heads(read_gguf(good["step35"])) == 2 and mtp_heads(read_gguf(good["qwen35"])) == 1


def test_each_hostile_target_is_one_error_line_on_generate_and_fit(good):
    """Without the checks the first of these commands to reach llama.cpp kills the child."""
    files = {name: _hostile(good, name) for name in CASES}
    commands = []
    for name in CASES:
        commands.append(["generate", "--target", str(files[name]), "-p", "hi", "-n", "2", "--ctx", "256"])
        commands.append(["fit", "--target", str(files[name]), "--ctx", "256"])
    procs = cli_batch(*commands)
    for i, name in enumerate(CASES):
        for proc in procs[2 * i: 2 * i + 2]:
            line = assert_one_error(proc, contains=CASES[name][3])
            assert files[name].name in line, line


def test_inspect_still_describes_a_hostile_target(good):
    """``inspect`` reads metadata only (no llama.cpp, no division by a metadata value)."""
    for name in ("hybrid_interval_0", "gemma4_all_layers_shared", "two_heads_one_present"):
        proc = run_cli("inspect", str(_hostile(good, name)), "--json")
        assert proc.returncode == 0, proc.stderr
    assert mtp_heads(read_gguf(_hostile(good, "two_heads_one_present"))) == 0


@pytest.mark.parametrize("window,pattern,ok", [
    (512, None, True),                  # the default period, 6: layers 0-4 slide
    (512, (1, U32), False),             # period 1: no layer slides
    (512, (0, U32), True),              # period 0: every layer slides
    (512, ([False] * 4, ARR, BOOL), False),
    (512, ([False, True, False, False], ARR, BOOL), True),
    (0, ([False] * 4, ARR, BOOL), True),   # no sliding window: gemma3 reads no pattern
])
def test_gemma3_sliding_layers_as_its_loader_marks_them(good, window, pattern, ok):
    """gemma3 slides only with ``sliding_window`` > 0, through a pattern array or a period."""
    def value(item):
        return None if item is None else item[0]

    info = read_gguf(good["llama"])
    metadata = {k.replace("llama.", "gemma3.", 1): v for k, v in info.metadata.items()}
    metadata["gemma3.attention.sliding_window"] = window
    if pattern is not None:
        metadata["gemma3.attention.sliding_window_pattern"] = value(pattern)
    gemma3 = dataclasses.replace(info, arch="gemma3", metadata=metadata)
    if ok:
        check_target(gemma3)
    else:
        with pytest.raises(LocalspecError, match="marks none of its 4 layers as sliding"):
            check_target(gemma3)


def test_the_server_answers_a_hostile_target_with_a_400_and_goes_on(good, tmp_path):
    """A model created from a good file whose file turns hostile before a request loads it: that
    request gets a 400 naming the key, the next request to the server's own model its answer."""
    import openai

    from serve_checks import running_server

    swap = tmp_path / "swap.gguf"
    shutil.copy(good["step35"], swap)
    (tmp_path / "Modelfile").write_text(f"FROM {swap}\n")

    def setup(env):
        assert run_cli("create", "swap", "-f", str(tmp_path / "Modelfile"), env=env).returncode == 0

    args = ("--target", str(good["llama"]), "--ctx", "256", "--parallel", "1")
    with running_server(tmp_path, *args, setup=setup) as srv:
        shutil.copy(_hostile(good, "two_heads_one_present"), swap)
        with pytest.raises(openai.BadRequestError) as caught:
            srv.client().completions.create(model="swap", prompt="hi", max_tokens=2)
        assert "lacks blk.2.nextn.eh_proj.weight" in str(caught.value), caught.value
        reply = srv.client().completions.create(model=good["llama"].stem, prompt="hi", max_tokens=2)
        assert reply.choices[0].text is not None
        assert srv.proc.poll() is None
