"""Read what localspec needs from a GGUF file, and check a target/drafter pair before llama.cpp
sees them (llama.cpp aborts the whole process on some mismatches).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import gguf_consts as K
from ..core.errors import LocalspecError
from ..llama.gguf_native import GGUFHeader
from .layer_checks import check_layers

GGUF_MAGIC = b"GGUF"
DFLASH_VARIANT = "dflash"   # GGUFInfo.variant of a block drafter (block_kind says which)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    type_name: str
    n_bytes: int


@dataclass(frozen=True)
class GGUFInfo:
    """Metadata of one GGUF file; drafter fields are None for a target."""

    path: Path
    arch: str
    name: str
    size_bytes: int
    n_embd: int
    n_layer: int
    n_ctx_train: int
    n_vocab: int
    tokenizer_sha256: str
    chat_template: str | None
    tensors: dict[str, TensorInfo] = field(repr=False)
    metadata: dict[str, Any] = field(repr=False)
    # drafter (eagle3) fields
    target_layers: tuple[int, ...] | None = None
    target_hidden_size: int | None = None
    variant: str | None = None
    fc_norm: bool = False
    fc_norm_eps: float | None = None
    norm_output: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    draft_vocab: int | None = None
    # why llama.cpp cannot tokenize with this file's vocabulary (it aborts the process), if it cannot
    tokenizer_issue: str | None = None
    # a block drafter's (dflash) mask token (tokenizer.ggml.mask_token_id), as the header says it
    mask_token: Any = None

    @property
    def is_drafter(self) -> bool:
        return self.arch == K.EAGLE3_ARCH

    @property
    def is_assistant(self) -> bool:
        """A Gemma 4 assistant: a drafter GGUF of NextN blocks that reads its gemma4 target's KV
        cache (llama.cpp's ``gemma4-assistant``; :mod:`localspec.speculation.assistant`)."""
        return self.arch == K.GEMMA4_ASSISTANT_ARCH

    @property
    def is_block_drafter(self) -> bool:
        """A DFlash or DSpark drafter (llama.cpp's ``dflash``): a block of drafts in one decode, from
        the target's layer inputs (:mod:`localspec.speculation.dflash`)."""
        return self.arch == K.DFLASH_ARCH

    @property
    def block_kind(self) -> str | None:
        """``dspark`` (a Markov head), ``dflash2`` (a selector) or ``dflash``; None: not a block drafter."""
        if not self.is_block_drafter:
            return None
        if K.T_MARKOV_W1 in self.tensors:
            return "dspark"
        return "dflash2" if K.T_SELECTOR_HIDDEN in self.tensors else "dflash"

    @property
    def weight_type(self) -> str:
        """The most common tensor type by bytes (what users call the file's quantisation)."""
        by_type: dict[str, int] = {}
        for t in self.tensors.values():
            by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
        return max(by_type, key=by_type.__getitem__) if by_type else "?"


# Every metadata value localspec or llama.cpp reads as a number or a text, by kind: checked once, in
# read_gguf (:func:`_check_values`), so nothing downstream (the memory plan, export, the drafter)
# meets text where a number belongs, a NaN, or a count of the wrong sign. One error type, one line.
_COUNTS = (K.KEY_CONTEXT_LENGTH, K.KEY_EMBEDDING_LENGTH, K.KEY_BLOCK_COUNT, K.KEY_FEED_FORWARD_LENGTH,
           K.KEY_HEAD_COUNT, K.KEY_HEAD_COUNT_KV, K.KEY_KEY_LENGTH, K.KEY_VALUE_LENGTH,
           K.KEY_ROPE_DIMENSION_COUNT, K.KEY_VOCAB_SIZE, K.KEY_SLIDING_WINDOW, K.KEY_NEXTN_PREDICT_LAYERS,
           K.KEY_EXPERT_COUNT, K.KEY_EXPERT_USED_COUNT, K.KEY_EXPERT_GROUP_COUNT, K.KEY_EXPERT_GROUP_USED_COUNT,
           K.KEY_TARGET_HIDDEN_SIZE, K.KEY_EMBEDDING_LENGTH_OUT, K.KEY_KEY_LENGTH_SWA, K.KEY_SHARED_KV_LAYERS,
           K.KEY_FULL_ATTENTION_INTERVAL, K.KEY_SSM_TIME_STEP_RANK, K.KEY_SSM_GROUP_COUNT,
           K.KEY_SSM_INNER_SIZE, K.KEY_EXPERT_FEED_FORWARD_LENGTH)     # an integer >= 0, or (per layer) a list of them
_POSITIVE_REALS = (K.KEY_RMS_EPS, K.KEY_ROPE_FREQ_BASE)                  # a finite number > 0
_FLAGS = (K.KEY_NORM_BEFORE_FC, K.KEY_NORM_BEFORE_RESIDUAL)              # a boolean (or 0 / 1)
_LS_TEXTS = (K.KEY_LS_VARIANT, K.KEY_LS_SOURCE_LAYOUT, K.KEY_LS_SOURCE, K.KEY_LS_SOURCE_REVISION, K.KEY_NAME)
_LS_FLAGS = (K.KEY_LS_FC_NORM, K.KEY_LS_NORM_OUTPUT)
_MAX_COUNT = 1 << 31      # llama.cpp reads these into 32-bit fields


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _check_values(p: Path, kv: dict, arch: str) -> None:
    """Each known key's value is of its kind (see _COUNTS ...), or one LocalspecError naming it."""
    def bad(name: str, what: str, value: Any) -> LocalspecError:
        return LocalspecError(f"{p}: {name} must be {what}, got {_short(value)}")

    for template in _COUNTS:
        name = K.key(template, arch)
        value = kv.get(name)
        items = value.tolist() if isinstance(value, np.ndarray) else value if isinstance(value, list) else [value]
        if value is None:
            continue
        if not items or not all(_is_int(x) for x in items):
            raise bad(name, "an integer (or one per layer)", value)
        if min(items) < 0:
            raise LocalspecError(f"{p}: {name} must not be negative, got {_short(value)}")
        if max(items) >= _MAX_COUNT:
            raise bad(name, f"below {_MAX_COUNT}", value)
    for template in _POSITIVE_REALS:
        name = K.key(template, arch)
        value = kv.get(name)
        if value is not None and not (_is_real(value) and math.isfinite(value) and value > 0):
            raise bad(name, "a positive finite number", value)
    for name in [K.key(t, arch) for t in _FLAGS] + list(_LS_FLAGS):
        value = kv.get(name)
        if value is not None and not (isinstance(value, (bool, np.bool_)) or _is_int(value) and value in (0, 1)):
            raise bad(name, "true or false", value)
    for name in _LS_TEXTS:
        value = kv.get(name)
        if value is not None and not isinstance(value, str):
            raise bad(name, "text", value)
    eps = kv.get(K.KEY_LS_FC_NORM_EPS)
    if eps is not None and not (_is_real(eps) and math.isfinite(eps) and eps > 0):
        raise bad(K.KEY_LS_FC_NORM_EPS, "a positive finite number", eps)


_NO_TOKENIZER = ("none", "no_vocab")
_BYTE_FALLBACK = ("llama", "t5")     # SentencePiece / Unigram: unknown text falls back to byte tokens


def _tokenizer_issue(kv: dict) -> str | None:
    """What makes llama.cpp abort on this vocabulary (llama-vocab.cpp), in words; None if nothing.
    - "none" / "no_vocab": the vocabulary type NONE, on which tokenizing asserts (GGML_ASSERT);
    - "llama" (SentencePiece) or "t5": text outside the vocabulary falls back to one token per byte,
      ``<0xXX>`` (or the byte itself), looked up with ``std::map::at``: a vocabulary without them
      (a BPE one under the wrong model name) throws std::out_of_range through the C API."""
    model, tokens = kv.get(K.KEY_TOKENIZER_MODEL), kv.get(K.KEY_TOKENIZER_TOKENS)
    if model in _NO_TOKENIZER:
        return f"{K.KEY_TOKENIZER_MODEL} is '{model}': the file has no tokenizer to turn text into tokens"
    if model in _BYTE_FALLBACK and isinstance(tokens, list):
        have = set(tokens)
        missing = [b for b in range(256) if f"<0x{b:02X}>" not in have and not (b < 0x80 and chr(b) in have)]
        if missing:
            return (f"{K.KEY_TOKENIZER_MODEL} is '{model}' (SentencePiece), whose byte fallback needs the tokens "
                    f"<0x00>..<0xFF>; this vocabulary lacks {len(missing)} of them, e.g. <0x{missing[0]:02X}> "
                    "(a BPE vocabulary is 'gpt2')")
    return None


def _tokenizer_sha(header: GGUFHeader) -> str:
    """Hash of the vocabulary and merges: two files share a tokenizer iff the hashes are equal."""
    h = hashlib.sha256()
    for name in (K.KEY_TOKENIZER_MODEL, K.KEY_TOKENIZER_TOKENS, K.KEY_TOKENIZER_MERGES):
        value = header.kv.get(name)
        if value is None:
            continue
        h.update(name.encode() + b"\0")
        for item in value if isinstance(value, list) else [value]:
            h.update(str(item).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=32)
def _read_cached(path: str, mtime_ns: int, size: int) -> GGUFInfo:
    p = Path(path)
    header = GGUFHeader(p)
    kv = header.kv
    arch = kv.get(K.KEY_ARCH)
    if not isinstance(arch, str) or not arch:
        raise LocalspecError(f"{p}: GGUF file has no {K.KEY_ARCH}")
    _check_values(p, kv, arch)

    tensors: dict[str, TensorInfo] = {}
    for name, (shape, kind, n_bytes, offset) in header.tensors.items():
        tensors[name] = TensorInfo(name, shape, GGUFHeader.type_name(kind), n_bytes)
        if offset + n_bytes > size:
            raise LocalspecError(f"{p}: file is truncated (tensor {name} runs past the end)")

    def meta(template: str) -> Any:
        return kv.get(K.key(template, arch))

    def count(template: str) -> int:
        """A size or count from the header: a non-negative integer (0 when absent)."""
        value = meta(template)
        if value is None:
            return 0
        if isinstance(value, (bool, float, str, bytes)) or not isinstance(value, (int, np.integer)):
            raise LocalspecError(f"{p}: {K.key(template, arch)} must be an integer, got {_short(value)}")
        if value < 0:
            raise LocalspecError(f"{p}: {K.key(template, arch)} must not be negative, got {value}")
        return int(value)

    metadata = {k: v for k, v in kv.items() if not k.startswith(K.KEY_TOKENIZER_PREFIX)}
    tokens = kv.get(K.KEY_TOKENIZER_TOKENS)
    n_vocab = len(tokens) if isinstance(tokens, list) else count(K.KEY_VOCAB_SIZE)
    if isinstance(tokens, list) and len(set(tokens)) != len(tokens):   # llama.cpp asserts on it
        seen: set[str] = set()
        twice = next(tok for tok in tokens if tok in seen or seen.add(tok))
        raise LocalspecError(f"{p}: its vocabulary lists the token {_short(twice)} twice")

    info: dict[str, Any] = dict(
        path=p,
        arch=arch,
        name=str(kv.get(K.KEY_NAME) or p.stem),
        size_bytes=size,
        n_embd=count(K.KEY_EMBEDDING_LENGTH),
        n_layer=count(K.KEY_BLOCK_COUNT),
        n_ctx_train=count(K.KEY_CONTEXT_LENGTH),
        n_vocab=n_vocab,
        tokenizer_sha256=_tokenizer_sha(header),
        tokenizer_issue=_tokenizer_issue(kv),
        chat_template=kv.get(K.KEY_CHAT_TEMPLATE),
        tensors=tensors,
        metadata=metadata,
    )
    if arch == K.DFLASH_ARCH:
        info.update(_block_fields(p, kv, tensors))
    if arch == K.EAGLE3_ARCH:
        layers = meta(K.KEY_TARGET_LAYERS)
        if layers is not None and not (isinstance(layers, (list, np.ndarray))
                                       and all(isinstance(x, (int, np.integer)) for x in layers)):
            raise LocalspecError(f"{p}: {K.key(K.KEY_TARGET_LAYERS, arch)} must be a list of integers, "
                                 f"got {_short(layers)}")
        d2t = tensors.get(K.T_D2T)
        info.update(
            target_layers=tuple(int(x) for x in layers) if layers is not None else None,
            target_hidden_size=count(K.KEY_TARGET_HIDDEN_SIZE) or None,
            variant=str(kv.get(K.KEY_LS_VARIANT) or K.VARIANT_EAGLE3),
            fc_norm=bool(kv.get(K.KEY_LS_FC_NORM) or False),
            fc_norm_eps=kv.get(K.KEY_LS_FC_NORM_EPS),
            norm_output=bool(kv.get(K.KEY_LS_NORM_OUTPUT) or False),
            norm_before_fc=bool(meta(K.KEY_NORM_BEFORE_FC) or False),
            norm_before_residual=bool(meta(K.KEY_NORM_BEFORE_RESIDUAL) or False),
            draft_vocab=d2t.shape[0] if d2t is not None else None,
        )
    return GGUFInfo(**info)


def _block_fields(p: Path, kv: dict, tensors: dict) -> dict[str, Any]:
    """A block drafter's (dflash) target layers, mask token and kind, as the header says them."""
    key = K.key(K.KEY_TARGET_LAYERS, K.DFLASH_ARCH)
    layers = kv.get(key)
    if layers is not None and not (isinstance(layers, (list, np.ndarray)) and all(_is_int(x) for x in layers)):
        raise LocalspecError(f"{p}: {key} must be a list of integers, got {_short(layers)}")
    return dict(target_layers=tuple(int(x) for x in layers) if layers is not None else None,
                mask_token=kv.get(K.KEY_MASK_ID), variant="dspark" if K.T_MARKOV_W1 in tensors else DFLASH_VARIANT)


def _short(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_gguf(path: str | Path) -> GGUFInfo:
    """Metadata of a GGUF file, or LocalspecError with one line saying what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LocalspecError(f"{p}: no such file")
    if not p.is_file():
        raise LocalspecError(f"{p}: not a file")
    try:
        with open(p, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise LocalspecError(f"{p}: not a GGUF file")
    except OSError as exc:   # unreadable (permissions), or gone since
        raise LocalspecError(f"{p}: cannot read ({exc.strerror or exc})") from None
    st = p.stat()
    return _read_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


def read_tensor(info: GGUFInfo, name: str) -> np.ndarray:
    """One tensor's data as numpy (plain-typed tensors only: norms, d2t)."""
    return GGUFHeader(info.path).tensor_data(name)


def _per_layer(info: GGUFInfo, template: str) -> list[int] | None:
    """A head count: one integer, or one per layer (GGUF arrays); None when absent."""
    value = info.metadata.get(K.key(template, info.arch))
    if value is None:
        return None
    items = value.tolist() if isinstance(value, np.ndarray) else value if isinstance(value, list) else [value]
    if not items or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in items):
        raise LocalspecError(f"{info.path.name}: {K.key(template, info.arch)} must be non-negative integers, "
                             f"got {_short(value)}")
    return [int(x) for x in items]


def check_attention(info: GGUFInfo) -> None:
    """Sizes llama.cpp divides by or builds tensors from (it aborts the process, or divides by zero,
    on a file where they disagree): heads dividing the embedding, KV heads dividing heads, RoPE
    dimensions within a head (and even), nothing zero that must not be."""
    name = info.path.name
    if info.n_embd <= 0 or info.n_layer <= 0:
        raise LocalspecError(f"{name}: missing or zero embedding size or layer count")
    n_head = _per_layer(info, K.KEY_HEAD_COUNT)
    if n_head is None or not any(n_head):
        raise LocalspecError(f"{name}: missing or zero {K.key(K.KEY_HEAD_COUNT, info.arch)}")
    if info.arch in K.ATTENTION_ARCHS and not all(n_head):   # every layer attends (gemma3: n_embd / n_head(0))
        raise LocalspecError(f"{name}: {K.key(K.KEY_HEAD_COUNT, info.arch)} must not be 0 for a layer: every layer "
                             f"of llama.cpp's {info.arch} attends")
    n_head_kv = _per_layer(info, K.KEY_HEAD_COUNT_KV) or n_head
    for counts, what in ((n_head, "head_count"), (n_head_kv, "head_count_kv")):
        if len(counts) not in (1, info.n_layer):
            raise LocalspecError(f"{name}: attention.{what} lists {len(counts)} layers, the model has {info.n_layer}")
    n_head = n_head * info.n_layer if len(n_head) == 1 else n_head
    n_head_kv = n_head_kv * info.n_layer if len(n_head_kv) == 1 else n_head_kv
    for h, hkv in zip(n_head, n_head_kv):
        if h and (hkv == 0 or h % hkv):
            raise LocalspecError(f"{name}: {h} attention heads cannot be shared by {hkv} KV heads "
                                 "(head_count_kv must divide head_count)")
    head_dim, head_v = _head_sizes(info, max(n_head))
    n_rot = info.metadata.get(K.key(K.KEY_ROPE_DIMENSION_COUNT, info.arch))
    if n_rot is not None:
        if isinstance(n_rot, bool) or not isinstance(n_rot, (int, np.integer)) or n_rot < 0:
            raise LocalspecError(f"{name}: rope.dimension_count must be a non-negative integer, got {_short(n_rot)}")
        if n_rot > head_dim or n_rot % 2 or (n_rot == 0 and info.is_drafter):
            # (a drafter with 0 RoPE dimensions made llama.cpp spin forever in its first draft)
            raise LocalspecError(f"{name}: rope.dimension_count {n_rot} must be even, "
                                 f"{'positive ' if info.is_drafter else ''}and at most the head size {head_dim}")
    ff = info.metadata.get(K.key(K.KEY_FEED_FORWARD_LENGTH, info.arch))
    if isinstance(ff, (int, np.integer)) and not isinstance(ff, bool) and ff <= 0 and info.is_drafter:
        raise LocalspecError(f"{name}: feed_forward_length must be positive, got {ff}")
    # the graphs of these architectures assert one head size for keys and values, some also that
    # RoPE covers the whole head (GGML_ASSERT: the process aborts, even with no drafter)
    if info.arch in K.SAME_KV_HEAD_ARCHS and head_v != head_dim:
        raise LocalspecError(f"{name}: value head size {head_v} differs from key head size {head_dim}; "
                             f"llama.cpp's {info.arch} needs them equal (attention.key_length / value_length)")
    rot = head_dim if n_rot is None else int(n_rot)
    if info.arch in K.ROT_IS_HEAD_ARCHS and rot != head_dim:
        raise LocalspecError(f"{name}: rope.dimension_count {rot} must equal the head size {head_dim} "
                             f"for llama.cpp's {info.arch}")


def _head_sizes(info: GGUFInfo, n_head: int) -> tuple[int, int]:
    """(key head size, value head size) as llama.cpp reads them: attention.key_length /
    value_length, each n_embd / n_head when absent."""
    name = info.path.name
    sizes = []
    for template in (K.KEY_KEY_LENGTH, K.KEY_VALUE_LENGTH):
        v = info.metadata.get(K.key(template, info.arch))
        what = template.rsplit(".", 1)[-1]
        if v is None:
            if info.n_embd % n_head:
                raise LocalspecError(f"{name}: embedding size {info.n_embd} is not a multiple of its "
                                     f"{n_head} attention heads (and attention.{what} is not given)")
            v = info.n_embd // n_head
        elif isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise LocalspecError(f"{name}: attention.{what} must be a positive integer, got {_short(v)}")
        sizes.append(int(v))
    return sizes[0], sizes[1]


def check_hparams(info: GGUFInfo) -> None:
    """What llama.cpp's loader asserts for every architecture (llama_model::load_hparams)."""
    name = info.path.name
    if not 0 < info.n_layer <= K.MAX_LAYERS:
        raise LocalspecError(f"{name}: block_count must be between 1 and {K.MAX_LAYERS}, got {info.n_layer}")
    nextn = _int_meta(info, K.KEY_NEXTN_PREDICT_LAYERS)
    if nextn > info.n_layer:
        raise LocalspecError(f"{name}: nextn_predict_layers {nextn} exceeds its {info.n_layer} layers")
    n_expert = _int_meta(info, K.KEY_EXPERT_COUNT)
    used = max(_per_layer(info, K.KEY_EXPERT_USED_COUNT) or [0])
    groups = _int_meta(info, K.KEY_EXPERT_GROUP_COUNT)
    group_used = _int_meta(info, K.KEY_EXPERT_GROUP_USED_COUNT)
    if n_expert > K.MAX_EXPERTS or used > n_expert or (n_expert and not used) or (not n_expert and groups) or (
            n_expert and (groups >= n_expert or groups > 1 and (n_expert % groups or not 0 < group_used < groups))):
        raise LocalspecError(f"{name}: inconsistent expert counts (expert_count {n_expert}, expert_used_count "
                             f"{used}, expert_group_count {groups}, expert_group_used_count {group_used})")
    scaling = info.metadata.get(K.key(K.KEY_ROPE_SCALING_TYPE, info.arch))
    if scaling is not None and scaling not in K.ROPE_SCALING_TYPES:
        raise LocalspecError(f"{name}: rope.scaling.type {_short(scaling)} is not one of "
                             f"{', '.join(K.ROPE_SCALING_TYPES)}")


def check_tensor_types(info: GGUFInfo) -> None:
    """Tensor types llama.cpp's CPU kernels take (it aborts on the others at the first decode): a
    vector (norm weight, bias) is added or multiplied in as F32 only; a matrix is a float or
    quantised type, never integers; d2t (checked with the pair) is I64."""
    for t in info.tensors.values():
        if t.name == K.T_D2T:
            continue
        # conf_proj.weight is a [n, 1] matrix (ggml_mul_mat, any float type: llama.cpp's converter
        # writes it F16 under --outtype f16) that reads as one-dimensional once its 1 is dropped
        if len(t.shape) == 1 and t.type_name != "F32" and t.name != K.T_CONF_PROJ:
            raise LocalspecError(f"{info.path.name}: tensor {t.name} is {t.type_name}; llama.cpp needs "
                                 "one-dimensional tensors (norms, biases) in F32")
        if t.type_name in K.NON_WEIGHT_TYPES:
            raise LocalspecError(f"{info.path.name}: tensor {t.name} is {t.type_name}, not a weight type "
                                 "llama.cpp can multiply with")


def _int_meta(info: GGUFInfo, template: str) -> int:
    """A single non-negative integer from the header (0 when absent)."""
    value = info.metadata.get(K.key(template, info.arch))
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise LocalspecError(f"{info.path.name}: {K.key(template, info.arch)} must be a non-negative integer, "
                             f"got {_short(value)}")
    return int(value)


def check_target(target: GGUFInfo) -> None:
    if target.is_drafter:
        raise LocalspecError(f"{target.path.name} is an EAGLE-3 drafter, not a target model")
    if target.is_block_drafter:
        raise LocalspecError(f"{target.path.name} is a {target.block_kind} block drafter, not a target model: "
                             "give it as the drafter (--draft, or DRAFT in a Modelfile) of its target")
    if target.is_assistant:
        raise LocalspecError(f"{target.path.name} is a Gemma 4 assistant (a drafter), not a target model: "
                             "give it as the drafter (--draft, or DRAFT in a Modelfile) of its gemma4 target")
    if target.n_vocab <= 0 or target.n_embd <= 0:
        raise LocalspecError(f"{target.path.name}: missing vocabulary or embedding size")
    if target.tokenizer_issue:
        raise LocalspecError(f"{target.path.name}: {target.tokenizer_issue}")
    check_hparams(target)
    check_layers(target)   # NextN blocks, sliding / shared-KV / recurrent layers, as its graph asserts them
    check_tensor_types(target)
    if target.arch in K.FEATURE_ARCHS or target.arch in K.ATTENTION_ARCHS:
        check_attention(target)   # the architectures localspec runs as targets: llama-style attention


def check_drafter(drafter: GGUFInfo) -> None:
    """A drafter's own sizes (the pair checks come on top, in :func:`check_pair`)."""
    if not drafter.is_drafter:
        raise LocalspecError(f"{drafter.path.name} is not an EAGLE-3 drafter (architecture '{drafter.arch}')")
    if drafter.tokenizer_issue:
        raise LocalspecError(f"{drafter.path.name}: {drafter.tokenizer_issue}")
    check_hparams(drafter)
    check_tensor_types(drafter)
    check_attention(drafter)
    if drafter.n_layer != 1:
        raise LocalspecError(f"{drafter.path.name}: an EAGLE-3 drafter has one layer, this one says {drafter.n_layer}")


def check_pair(target: GGUFInfo, drafter: GGUFInfo) -> None:
    """Every check that keeps llama.cpp from aborting on a target/drafter mismatch."""
    if drafter.is_assistant:
        check_assistant_pair(target, drafter)
        return
    if drafter.is_block_drafter:
        check_block_pair(target, drafter)
        return
    t, d = target.path.name, drafter.path.name
    check_target(target)
    check_drafter(drafter)
    if target.arch not in K.FEATURE_ARCHS:
        raise LocalspecError(
            f"target architecture '{target.arch}' ({t}) cannot export layer features in this llama.cpp; "
            f"EAGLE-3 works with: {', '.join(sorted(K.FEATURE_ARCHS))}"
        )
    layers = drafter.target_layers
    if layers is None or len(layers) != 3:
        raise LocalspecError(f"{d}: {K.key(K.KEY_TARGET_LAYERS, K.EAGLE3_ARCH)} must list exactly 3 layers (got {layers})")
    bad = [lid for lid in layers if not 0 <= lid < target.n_layer]
    if bad:
        raise LocalspecError(
            f"{d}: target layers {list(layers)} out of range for {t} ({target.n_layer} layers)"
        )
    if drafter.target_hidden_size != target.n_embd:
        raise LocalspecError(
            f"{d} was made for a target of hidden size {drafter.target_hidden_size}, "
            f"but {t} has {target.n_embd}"
        )
    if drafter.tokenizer_sha256 != target.tokenizer_sha256:
        raise LocalspecError(f"{d} and {t} do not share the same tokenizer")
    fc = drafter.tensors.get(K.T_FC)
    if fc is None or fc.shape[0] != 3 * target.n_embd:
        raise LocalspecError(f"{d}: fc.weight must take 3 x {target.n_embd} target features")
    embd = drafter.tensors.get(K.T_TOKEN_EMBD)
    borrowed = [what for what, own in (("token embeddings", embd), ("lm_head", drafter.tensors.get(K.T_OUTPUT)))
                if own is None]
    if borrowed and drafter.n_embd != target.n_embd:
        raise LocalspecError(
            f"{d} borrows the target's {' and '.join(borrowed)} but its width {drafter.n_embd} "
            f"differs from {t}'s {target.n_embd}"
        )
    if embd is not None and embd.shape[-1] != target.n_vocab:
        raise LocalspecError(f"{d}: its token embeddings cover {embd.shape[-1]} tokens, {t} has {target.n_vocab}")
    head = drafter.tensors.get(K.T_OUTPUT)
    if drafter.draft_vocab is not None:
        d2t_info = drafter.tensors[K.T_D2T]
        if d2t_info.type_name != K.D2T_TYPE or len(d2t_info.shape) != 1:
            raise LocalspecError(f"{d}: d2t must be a one-dimensional {K.D2T_TYPE} tensor, "
                                 f"this one is {d2t_info.type_name} of shape {list(d2t_info.shape)}")
        if head is None or head.shape[-1] != drafter.draft_vocab:
            raise LocalspecError(f"{d}: d2t maps {drafter.draft_vocab} draft tokens but the drafter has no lm_head of that size")
        d2t = read_tensor(drafter, K.T_D2T).astype(np.int64).ravel()
        if d2t.min() < 0 or d2t.max() >= target.n_vocab:
            raise LocalspecError(f"{d}: d2t maps to token ids outside {t}'s vocabulary (0..{target.n_vocab - 1})")
        if len(np.unique(d2t)) != len(d2t):
            raise LocalspecError(f"{d}: d2t maps two draft tokens to the same target token")
    elif head is not None and head.shape[-1] != target.n_vocab:
        raise LocalspecError(f"{d}: lm_head has {head.shape[-1]} rows but no d2t mapping to {t}'s {target.n_vocab} tokens")
    if drafter.norm_output and K.T_OUTPUT_NORM not in drafter.tensors:
        raise LocalspecError(f"{d}: norm_output needs output_norm.weight")


def mtp_heads(info: GGUFInfo) -> int:
    """How many MTP heads a target GGUF carries, as llama.cpp recognises them
    (``common_speculative_types_from_gguf``): ``{arch}.nextn_predict_layers``, after at least one
    trunk layer, and every NextN block's tensors; 0: none (or a GGUF that declares heads it does
    not hold, which check_target refuses when it holds some of them)."""
    n = info.metadata.get(K.key(K.KEY_NEXTN_PREDICT_LAYERS, info.arch))
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n < info.n_layer:
        return 0
    held = all(f"blk.{i}.{t}" in info.tensors for i in range(info.n_layer - n, info.n_layer) for t in K.NEXTN_TENSORS)
    return int(n) if held else 0


def recurrent_note(info: GGUFInfo) -> str | None:
    """What a target with a recurrent state per sequence (``{arch}.ssm.*``, ``.wkv.*``,
    ``.shortconv.*`` keys: Mamba, RWKV, Qwen3.5's gated delta nets, LFM2 ...) means for drafting
    (localspec.runtime.recurrent); None for a target with a KV cache only, and for drafters."""
    prefixes = tuple(f"{info.arch}.{p}." for p in ("ssm", "wkv", "shortconv"))
    if info.is_drafter or not any(k.startswith(prefixes) for k in info.metadata):
        return None
    if info.arch in K.RS_ROLLBACK_ARCHS:
        from ..llama.contexts import RS_ROLLBACK
        return (f"{info.arch}: a recurrent state per sequence; llama.cpp rolls it back {RS_ROLLBACK} tokens "
                f"at most, so drafts are chains of {RS_ROLLBACK} tokens or fewer")
    return f"{info.arch}: a recurrent state the pinned llama.cpp cannot roll back: plain decoding, no drafts"


def _swa_layers(info: GGUFInfo) -> list[bool]:
    """``attention.sliding_window_pattern``: per layer, whether it attends through a sliding window."""
    value = info.metadata.get(K.key(K.KEY_SLIDING_WINDOW_PATTERN, info.arch))
    items = value.tolist() if isinstance(value, np.ndarray) else value if isinstance(value, list) else []
    return [bool(x) for x in items]


def _kv_shape(info: GGUFInfo, layer: int, swa: bool) -> tuple[int, int]:
    """(head size, KV heads) of one layer's keys, as llama.cpp reads them for a gemma4 file."""
    heads = _per_layer(info, K.KEY_HEAD_COUNT_KV) or _per_layer(info, K.KEY_HEAD_COUNT) or [0]
    full = _int_meta(info, K.KEY_KEY_LENGTH)
    size = _int_meta(info, K.KEY_KEY_LENGTH_SWA) or full if swa else full
    return size, heads[layer] if len(heads) > 1 else heads[0]


def check_assistant(drafter: GGUFInfo) -> None:
    """A Gemma 4 assistant's own sizes (llama.cpp's gemma4-assistant loader and memory)."""
    d = drafter.path.name
    if drafter.tokenizer_issue:
        raise LocalspecError(f"{d}: {drafter.tokenizer_issue}")
    check_hparams(drafter)
    check_tensor_types(drafter)
    check_attention(drafter)   # heads sharing KV heads evenly (ggml asserts it), RoPE within a head
    if _int_meta(drafter, K.KEY_NEXTN_PREDICT_LAYERS) != drafter.n_layer:
        raise LocalspecError(f"{d}: a Gemma 4 assistant's blocks are all NextN blocks "
                             f"(nextn_predict_layers must equal block_count {drafter.n_layer})")
    if _int_meta(drafter, K.KEY_EMBEDDING_LENGTH_OUT) in (0, drafter.n_embd):
        raise LocalspecError(f"{d}: embedding_length_out must carry its target's hidden size "
                             f"(llama.cpp refuses an assistant whose is its own width, {drafter.n_embd})")
    if len(_swa_layers(drafter)) != drafter.n_layer or not any(_swa_layers(drafter)):
        raise LocalspecError(f"{d}: attention.sliding_window_pattern must list its {drafter.n_layer} layers, "
                             "at least one sliding (llama.cpp asserts it)")
    for name in (K.T_NEXTN_PROJ_PRE, K.T_NEXTN_PROJ_POST, K.T_TOKEN_EMBD):
        if name not in drafter.tensors:
            raise LocalspecError(f"{d}: a Gemma 4 assistant needs the tensor {name}")


def check_assistant_pair(target: GGUFInfo, drafter: GGUFInfo) -> None:
    """A Gemma 4 assistant against its target: same vocabulary, its input and output at the
    target's width, and each of its layers reading a target cache of its own shape: a sliding
    layer the target's last sliding layer's (``n_layer - 2``), a full one the last full layer's
    (``llama_model::create_memory``: llama.cpp views the target's K/V with the assistant's sizes)."""
    t, d = target.path.name, drafter.path.name
    check_target(target)
    check_assistant(drafter)
    if target.arch != K.GEMMA4_ARCH:
        raise LocalspecError(f"{d} is a Gemma 4 assistant: it drafts for a gemma4 target, and {t} is '{target.arch}'")
    width = _int_meta(drafter, K.KEY_EMBEDDING_LENGTH_OUT)
    if width != target.n_embd:
        raise LocalspecError(f"{d} was made for a target of hidden size {width}, but {t} has {target.n_embd}")
    embd = drafter.tensors[K.T_TOKEN_EMBD]
    if drafter.tokenizer_sha256 != target.tokenizer_sha256 or embd.shape[-1] != target.n_vocab:
        raise LocalspecError(f"{d} and {t} do not share the same tokenizer")
    t_swa = _swa_layers(target)
    if len(t_swa) != target.n_layer or target.n_layer < 2 or not t_swa[-2] or t_swa[-1]:
        raise LocalspecError(f"{t}: a Gemma 4 assistant reads the caches of the target's last two layers, "
                             "which must be a sliding and a full one (attention.sliding_window_pattern)")
    for layer, swa in enumerate(_swa_layers(drafter)):
        mine = _kv_shape(drafter, layer, swa)
        theirs = _kv_shape(target, target.n_layer - (2 if swa else 1), swa)
        if mine != theirs:
            raise LocalspecError(f"{d}: its layer {layer} reads {t}'s {'sliding' if swa else 'full'} cache "
                                 f"of {theirs[1]} heads of {theirs[0]} with {mine[1]} heads of {mine[0]}")


# -- block drafters (DFlash, DSpark) -----------------------------------------------------------------
def _dims(info: GGUFInfo, name: str) -> list[int] | None:
    t = info.tensors.get(name)
    return list(t.shape) if t is not None else None


def check_block_drafter(drafter: GGUFInfo) -> None:
    """A DFlash / DSpark drafter's own sizes: what llama.cpp's dflash loader and draft-dflash
    assert or misread (a missing block size, mask token or layer list; a Markov head or a
    confidence head of another rank). DFlash2 (a selector) and DeepSeek V4 DSpark blocks are not run."""
    d, arch = drafter.path.name, K.DFLASH_ARCH
    if drafter.tokenizer_issue:
        raise LocalspecError(f"{d}: {drafter.tokenizer_issue}")
    check_hparams(drafter)
    check_tensor_types(drafter)
    if drafter.block_kind == "dflash2":
        raise LocalspecError(f"{d} is a DFlash2 drafter (a selector lattice): localspec drafts with DFlash and DSpark only")
    if _int_meta(drafter, K.KEY_HC_COUNT):
        raise LocalspecError(f"{d} is a DSpark drafter of DeepSeek V4 blocks: localspec does not run those")
    check_attention(drafter)
    block = drafter.metadata.get(K.key(K.KEY_BLOCK_SIZE, arch))
    if not _is_int(block) or not 2 <= block <= K.BLOCK_SIZE_MAX:
        raise LocalspecError(f"{d}: {K.key(K.KEY_BLOCK_SIZE, arch)} must be an integer from 2 to "
                             f"{K.BLOCK_SIZE_MAX} (an anchor and at least one draft), got {_short(block)}")
    layers = drafter.target_layers
    if not layers:
        raise LocalspecError(f"{d}: {K.key(K.KEY_TARGET_LAYERS, arch)} must list the target layers it reads (got {layers})")
    if len(set(layers)) != len(layers):
        raise LocalspecError(f"{d}: {K.key(K.KEY_TARGET_LAYERS, arch)} lists a layer twice ({list(layers)})")
    mask = drafter.mask_token
    if not _is_int(mask) or not 0 <= mask < drafter.n_vocab:
        raise LocalspecError(f"{d}: its mask token ({K.KEY_MASK_ID}) must be a token of its vocabulary "
                             f"(0..{drafter.n_vocab - 1}), got {_short(mask)}")
    if drafter.block_kind == "dspark":
        _check_dspark_heads(drafter)


def _check_dspark_heads(drafter: GGUFInfo) -> None:
    """DSpark's Markov head (w1: [rank, vocab], w2: [rank, draft vocab]) and its optional
    confidence head ([n_embd + rank, 1], a bias of 1)."""
    d = drafter.path.name
    w1, w2 = _dims(drafter, K.T_MARKOV_W1), _dims(drafter, K.T_MARKOV_W2)
    if w1 is None or len(w1) != 2 or w2 is None or len(w2) != 2 or w1[0] != w2[0] or w1[0] <= 0:
        raise LocalspecError(f"{d}: the Markov head's weights disagree on its rank "
                             f"(markov_w1 {w1}, markov_w2 {w2}; both [rank, vocabulary])")
    conf = _dims(drafter, K.T_CONF_PROJ)
    if conf is not None and conf not in ([drafter.n_embd + w1[0], 1], [drafter.n_embd + w1[0]]):
        raise LocalspecError(f"{d}: conf_proj must be [{drafter.n_embd + w1[0]}, 1] (its width {drafter.n_embd} "
                             f"plus the Markov rank {w1[0]}), got {conf}")
    bias = _dims(drafter, K.T_CONF_PROJ_B)
    if bias is not None and bias != [1]:
        raise LocalspecError(f"{d}: conf_proj.bias must hold one value, got shape {bias}")
    if conf is None and bias is not None:
        raise LocalspecError(f"{d}: conf_proj.bias without conf_proj.weight")


def check_block_pair(target: GGUFInfo, drafter: GGUFInfo) -> None:
    """A DFlash / DSpark drafter against its target: the layers it reads exist and are exported,
    their width is its fc's input, the same tokenizer, its borrowed embeddings and head fit."""
    t, d = target.path.name, drafter.path.name
    check_target(target)
    check_block_drafter(drafter)
    if target.arch not in K.FEATURE_ARCHS:
        raise LocalspecError(f"target architecture '{target.arch}' ({t}) cannot export layer inputs in this "
                             f"llama.cpp; DFlash and DSpark work with: {', '.join(sorted(K.FEATURE_ARCHS))}")
    layers, top = drafter.target_layers, target.n_layer + (target.arch in K.LAST_LAYER_INP_ARCHS)
    if any(not 0 <= lid < top for lid in layers):
        raise LocalspecError(f"{d}: target layers {list(layers)} out of range for {t} "
                             f"({target.n_layer} layers: 0..{top - 1})")
    if drafter.tokenizer_sha256 != target.tokenizer_sha256:
        raise LocalspecError(f"{d} and {t} do not share the same tokenizer")
    fc = _dims(drafter, K.T_FC)
    if fc is None or fc[0] != len(layers) * target.n_embd:
        raise LocalspecError(f"{d}: fc.weight must take {len(layers)} x {target.n_embd} target features "
                             f"({len(layers)} layers of {t}), got {fc}")
    _check_borrowed(target, drafter)


def _check_borrowed(target: GGUFInfo, drafter: GGUFInfo) -> None:
    """The token embeddings and lm_head a block drafter borrows from its target (ctx_other) or
    ships: its width where borrowed, the target's vocabulary (or d2t's) where shipped."""
    t, d = target.path.name, drafter.path.name
    embd, head = _dims(drafter, K.T_TOKEN_EMBD), _dims(drafter, K.T_OUTPUT)
    borrowed = [what for what, own in (("token embeddings", embd), ("lm_head", head or embd)) if own is None]
    if borrowed and drafter.n_embd != target.n_embd:
        raise LocalspecError(f"{d} borrows the target's {' and '.join(borrowed)} but its width {drafter.n_embd} "
                             f"differs from {t}'s {target.n_embd}")
    if embd is not None and embd[-1] != target.n_vocab:
        raise LocalspecError(f"{d}: its token embeddings cover {embd[-1]} tokens, {t} has {target.n_vocab}")
    d2t = _dims(drafter, K.T_D2T)
    rows = d2t[0] if d2t else target.n_vocab
    if head is not None and head[-1] != rows:
        raise LocalspecError(f"{d}: lm_head has {head[-1]} rows, {'d2t maps' if d2t else t + ' has'} {rows}")
    w1, w2 = _dims(drafter, K.T_MARKOV_W1), _dims(drafter, K.T_MARKOV_W2)
    if w1 is not None and (w1[1] != target.n_vocab or w2[1] != rows):
        raise LocalspecError(f"{d}: the Markov head covers {w1[1]} and {w2[1]} tokens, {t} has {target.n_vocab}")
