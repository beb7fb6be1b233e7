"""Every target/drafter mismatch is a one-line LocalspecError before llama.cpp sees the files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec import Engine, LocalspecError
from localspec.formats import gguf_consts as K
from localspec.converters.gguf_writer import write_drafter_gguf
from localspec.formats.gguf_info import check_pair, read_gguf
from tiny_models import build_drafter, build_target, drafter_weights


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("val")
    target = build_target(d / "target.gguf", "repeat")
    return d, target


def _drafter(d: Path, target: Path, name: str, **kw) -> Path:
    return write_drafter_gguf(drafter_weights("random", **kw), target, d / name, outtype="f32")


def expect_error(target, drafter, match: str) -> None:
    with pytest.raises(LocalspecError, match=match) as info:
        Engine(target, drafter, n_ctx=256)
    assert "\n" not in str(info.value)


def test_missing_and_non_gguf_files(tiny, tmp_path):
    d, target = tiny
    expect_error(tmp_path / "nope.gguf", None, "no such file")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    expect_error(junk, None, "not a GGUF file")
    expect_error(target, junk, "not a GGUF file")
    expect_error(tmp_path, None, "not a file")


def test_truncated_file(tiny, tmp_path):
    d, target = tiny
    cut = tmp_path / "cut.gguf"
    data = target.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    expect_error(cut, None, "truncated")
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:100])
    expect_error(header_only, None, "not a valid GGUF")


def test_roles_swapped(tiny):
    d, target = tiny
    drafter = build_drafter(d / "ok.gguf", target, "repeat")
    expect_error(drafter, None, "is an EAGLE-3 drafter, not a target")
    expect_error(target, target, "is not an EAGLE-3 drafter")


def test_unsupported_target_architecture(tiny, tmp_path):
    d, target = tiny
    drafter = build_drafter(d / "ok2.gguf", target, "repeat")
    qwen2 = build_target(tmp_path / "qwen2.gguf", "repeat", arch="qwen2")
    expect_error(qwen2, drafter, "cannot export layer features")
    # without a drafter the same target is fine for plain decoding... if llama.cpp knows the arch
    assert read_gguf(qwen2).arch == "qwen2"


def test_layers_out_of_range(tiny):
    d, target = tiny
    expect_error(target, _drafter(d, target, "layers.gguf", layers=(0, 1, 9)), r"out of range .*4 layers")


def test_hidden_size_mismatch(tiny):
    d, target = tiny
    w = drafter_weights("random", target_hidden=32)
    bad = write_drafter_gguf(w, target, d / "hidden.gguf", outtype="f32")
    expect_error(target, bad, "hidden size 32")


def test_tokenizer_mismatch(tiny, tmp_path):
    import gguf

    d, target = tiny
    drafter = build_drafter(d / "tok.gguf", target, "repeat")
    # a target whose vocabulary differs in one token
    other = tmp_path / "other.gguf"
    reader = gguf.GGUFReader(target)
    writer = gguf.GGUFWriter(str(other), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens":
            value = list(value)
            value[1000] = value[1000] + "x"
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expect_error(other, drafter, "do not share the same tokenizer")


def test_d2t_out_of_range_or_duplicated(tiny):
    d, target = tiny
    w = drafter_weights("repeat", d2t=np.arange(100))
    w.d2t = w.d2t.copy()
    w.d2t[5] = 60000
    expect_error(target, write_drafter_gguf(w, target, d / "d2t_range.gguf", outtype="f32"), "outside")
    w.d2t[5] = 7
    expect_error(target, write_drafter_gguf(w, target, d / "d2t_dup.gguf", outtype="f32"), "same target token")


def test_d2t_without_matching_lm_head(tiny):
    d, target = tiny
    w = drafter_weights("repeat", d2t=np.arange(100))
    w.tensors[K.T_OUTPUT] = w.tensors[K.T_OUTPUT][:50]
    expect_error(target, write_drafter_gguf(w, target, d / "d2t_head.gguf", outtype="f32"), "no lm_head of that size")


def test_check_pair_accepts_a_good_pair(tiny):
    d, target = tiny
    drafter = build_drafter(d / "good.gguf", target, "repeat", d2t=np.arange(0, 49152, 7))
    check_pair(read_gguf(target), read_gguf(drafter))


def test_bad_pair_from_the_cli_is_one_line_and_no_native_abort(tiny):
    d, target = tiny
    bad = _drafter(d, target, "cli_layers.gguf", layers=(0, 1, 40))
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", "--target", str(target), "--draft", str(bad),
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("Error:") and len(proc.stderr.strip().splitlines()) == 1


def test_borrowed_embeddings_need_the_target_width(tiny, tmp_path):
    d, target = tiny
    narrow = build_target(tmp_path / "narrow.gguf", "repeat")  # 64 wide, like the drafter
    drafter = build_drafter(d / "borrow.gguf", target, "repeat")
    check_pair(read_gguf(narrow), read_gguf(drafter))
    info = read_gguf(drafter)
    wide = type(info)(**{**info.__dict__, "n_embd": 128})
    with pytest.raises(LocalspecError, match="borrows the target's token embeddings and lm_head"):
        check_pair(read_gguf(target), wide)
