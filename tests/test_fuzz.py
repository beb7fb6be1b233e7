"""Property-based fuzzing (hypothesis) of the input readers: the Modelfile parser, the bench prompt
file reader and the GGUF header checks. Each either accepts its input or raises LocalspecError;
nothing else escapes, and llama.cpp never aborts on a file the checks accepted (those are loaded in
a worker process, so a native abort fails the test instead of killing it). Kept small: modest
max_examples, no deadline."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec import LocalspecError
from localspec.formats import gguf_consts as K
from localspec.runtime.bench import load_prompts
from localspec.formats.gguf_info import GGUFInfo, check_pair, read_gguf
from localspec.formats.modelfile import INSTRUCTIONS, PARAMETERS, Modelfile, parse
from tiny_models import build_drafter, build_target, rewrite_gguf

HANG_SECONDS = 30   # a tiny model loads and generates 4 tokens in well under a second
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


# -- the Modelfile parser ----------------------------------------------------------------------------
def _parses_or_refuses(text: str) -> None:
    try:
        mf = parse(text)
    except LocalspecError as exc:
        assert "\n" not in str(exc).rstrip("\n").split(": ", 1)[0]
        return
    assert isinstance(mf, Modelfile) and mf.from_ is not None


@FAST
@given(st.text())
def test_modelfile_any_text(text):
    _parses_or_refuses(text)


_WORDS = st.sampled_from(list(INSTRUCTIONS) + ["ADAPTER", "from", "parameter", "#", ""])
_VALUES = st.one_of(st.text(max_size=20), st.integers().map(str), st.floats().map(str),
                    st.sampled_from(['"""', '"', '""" x """', '"a\\"b"', "true", "nan", "-inf", "1e999", "-1", "0"]))
_PARAM_LINE = st.builds(lambda n, v: f"PARAMETER {n} {v}", st.sampled_from(sorted(PARAMETERS)), _VALUES)
_LINE = st.one_of(_PARAM_LINE, st.builds(lambda w, v: f"{w} {v}", _WORDS, _VALUES),
                  st.builds(lambda r, v: f"MESSAGE {r} {v}", st.sampled_from(["user", "system", "bot"]), _VALUES))


@FAST
@given(st.lists(_LINE, max_size=8))
def test_modelfile_structured_lines(lines):
    _parses_or_refuses("FROM ./t.gguf\n" + "\n".join(lines))


# -- the bench prompt file reader --------------------------------------------------------------------
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)
_PROMPT_OBJ = st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=10), _JSON)},
                                    optional={"system": _JSON, "category": _JSON})


def _read_bench(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "prompts.jsonl"
        p.write_bytes(data)
        try:
            items = load_prompts(p)
        except LocalspecError as exc:
            assert "\n" not in str(exc)
            return
        for item in items:
            assert isinstance(item.prompt, str) and item.prompt.strip()
            assert item.system is None or isinstance(item.system, str)
            (item.system or "").encode("utf-8")
            item.prompt.encode("utf-8")


@FAST
@given(st.binary(max_size=200))
def test_bench_file_any_bytes(data):
    _read_bench(data)


@FAST
@given(st.lists(st.one_of(_PROMPT_OBJ, _JSON), min_size=1, max_size=4))
def test_bench_file_json_lines(objs):
    _read_bench("\n".join(json.dumps(o) for o in objs).encode("utf-8", "surrogatepass"))


# -- GGUF headers ------------------------------------------------------------------------------------
WORKER = r"""
import sys
from localspec import LocalspecError
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.speculation.policy import PolicyConfig
config = GenerationConfig(max_tokens=4, policy=PolicyConfig(name="fixed", draft_max=2))
for line in sys.stdin:
    target, drafter = (line.rstrip("\n").split("\t") + [""])[:2]
    try:
        with Engine(target, drafter or None, n_ctx=64, n_threads=1) as engine:
            for _ in engine.generate("hi there", config):   # a prefill, drafts and a verify
                pass
        print("ok", flush=True)
    except LocalspecError as exc:
        print("error", str(exc).replace("\n", " "), flush=True)
    except Exception as exc:
        print("other", type(exc).__name__, str(exc).replace("\n", " ")[:200], flush=True)
"""


class Loader:
    """One worker process that loads (target, drafter) pairs in llama.cpp through the Engine's checks
    and generates a few tokens with them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env={**os.environ, "LOCALSPEC_THREADS": "1"})

    def load(self, target: Path, drafter: Path | None = None) -> str:
        assert self.proc.poll() is None, "the loader died earlier"
        self.proc.stdin.write(f"{target}\t{drafter or ''}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], HANG_SECONDS)
        if not ready:   # a file the checks let through made llama.cpp spin
            self.proc.kill()
            raise AssertionError(f"llama.cpp hung for {HANG_SECONDS} s on {target} {drafter}")
        answer = self.proc.stdout.readline()
        assert answer, f"llama.cpp ended the process (exit {self.proc.wait()}) on {target} {drafter}"
        assert not answer.startswith("other"), answer
        # on an abort ggml's crash handler may print a backtrace to stdout before the process ends
        assert answer.split(" ", 1)[0].strip() in ("ok", "error"), \
            f"llama.cpp ended the process (exit {self.proc.wait()}) on {target} {drafter}: {answer!r}"
        return answer.split(" ", 1)[0].strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    target = build_target(d / "t.gguf", "repeat")
    return d, target, build_drafter(d / "d.gguf", target, "repeat")


@pytest.fixture(scope="module")
def loader():
    worker = Loader()
    yield worker
    worker.close()


_TYPES = {gguf.GGUFValueType.UINT32: st.integers(0, 2**32 - 1), gguf.GGUFValueType.INT32: st.integers(-2**31, 2**31 - 1),
          gguf.GGUFValueType.UINT64: st.integers(0, 2**64 - 1), gguf.GGUFValueType.FLOAT32: st.floats(width=32),
          gguf.GGUFValueType.STRING: st.text(max_size=5), gguf.GGUFValueType.BOOL: st.booleans()}
_SMALL = st.one_of(st.integers(0, 130), st.sampled_from([0, 1, 2, 3, 4, 8, 15, 16, 17, 32, 64, 128, 2**31, 2**32 - 1]))
_SIZE_KEYS = [K.KEY_EMBEDDING_LENGTH, K.KEY_BLOCK_COUNT, K.KEY_CONTEXT_LENGTH, K.KEY_FEED_FORWARD_LENGTH,
              K.KEY_HEAD_COUNT, K.KEY_HEAD_COUNT_KV, K.KEY_KEY_LENGTH, K.KEY_VALUE_LENGTH, K.KEY_ROPE_DIMENSION_COUNT,
              K.KEY_TARGET_HIDDEN_SIZE, K.KEY_VOCAB_SIZE]


@st.composite
def _mutation(draw):
    """Changes to one of the two files: a size key set to a small (often inconsistent) integer or to a
    value of another type, dropped, or target_layers changed."""
    role = draw(st.sampled_from(["target", "drafter"]))
    arch = "llama" if role == "target" else K.EAGLE3_ARCH
    changes = {}
    for _ in range(draw(st.integers(1, 3))):
        template = draw(st.sampled_from(_SIZE_KEYS + [K.KEY_TARGET_LAYERS]))
        key = K.key(template, arch)
        how = draw(st.sampled_from(["small", "typed", "drop"]))
        if how == "drop":
            changes[key] = None
        elif template == K.KEY_TARGET_LAYERS:
            changes[key] = (draw(st.lists(st.integers(-2, 6), max_size=4)), gguf.GGUFValueType.ARRAY,
                            gguf.GGUFValueType.INT32)
        elif how == "small":
            changes[key] = (draw(_SMALL), gguf.GGUFValueType.UINT32)
        else:
            kind = draw(st.sampled_from(sorted(_TYPES, key=int)))
            changes[key] = (draw(_TYPES[kind]), kind)
    return role, changes


@SLOW
@given(mutation=_mutation())
def test_gguf_metadata_mutations(tiny, loader, mutation):
    d, target, drafter = tiny
    role, changes = mutation
    with tempfile.TemporaryDirectory() as tmp:
        try:
            changed = rewrite_gguf(target if role == "target" else drafter, Path(tmp) / f"{role}.gguf", changes)
        except (ValueError, TypeError, OverflowError, AssertionError):
            return   # a value the gguf writer itself refuses to store
        pair = (changed, drafter) if role == "target" else (target, changed)
        try:
            check_pair(read_gguf(pair[0]), read_gguf(pair[1]))
            accepted = True
        except LocalspecError as exc:
            assert "\n" not in str(exc)
            accepted = False
        if accepted:   # the checks let it through: llama.cpp must load it (or refuse it) without aborting
            loader.load(*pair)


@SLOW
@given(st.data())
def test_gguf_header_byte_mutations(tiny, loader, data):
    """Bytes flipped anywhere in the header and metadata (before the tensor data): ggml's parser and
    localspec's checks refuse the file or llama.cpp loads it; the process never dies."""
    d, target, drafter = tiny
    src = data.draw(st.sampled_from([target, drafter]))
    raw = bytearray(src.read_bytes())
    data_start = _data_offset(src)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, data_start - 1))
        raw[at] = data.draw(st.integers(0, 255))
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.gguf"
        p.write_bytes(bytes(raw))
        loader.load(*((p, None) if src == target else (target, p)))


def _data_offset(path: Path) -> int:
    from localspec.llama.gguf_native import GGUFHeader

    return min(offset for _, _, _, offset in GGUFHeader(path).tensors.values())


def test_check_pair_on_mutated_infos_never_raises_anything_else(tiny):
    """Sizes as check_pair sees them, inconsistent in every combination of a few values."""
    import dataclasses
    import itertools

    d, target, drafter = tiny
    t, dr = read_gguf(target), read_gguf(drafter)
    for n_embd, heads, kv_heads, rope in itertools.product([0, 64, 63], [0, 4, 5], [0, 2, 3], [0, 16, 17, 32]):
        meta = dict(dr.metadata)
        meta.update({K.key(K.KEY_HEAD_COUNT, dr.arch): heads, K.key(K.KEY_HEAD_COUNT_KV, dr.arch): kv_heads,
                     K.key(K.KEY_ROPE_DIMENSION_COUNT, dr.arch): rope})
        info: GGUFInfo = dataclasses.replace(dr, n_embd=n_embd, metadata=meta)
        try:
            check_pair(t, info)
        except LocalspecError:
            continue
        assert heads and kv_heads and heads % kv_heads == 0 and 0 < rope <= 16 and rope % 2 == 0 and n_embd
