"""Read what localspec needs from a GGUF file, and check a target/drafter pair before llama.cpp
sees them (llama.cpp aborts the whole process on some mismatches).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import gguf_consts as K
from .errors import LocalspecError
from .gguf_native import GGUFHeader

GGUF_MAGIC = b"GGUF"


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

    @property
    def is_drafter(self) -> bool:
        return self.arch == K.EAGLE3_ARCH

    @property
    def weight_type(self) -> str:
        """The most common tensor type by bytes (what users call the file's quantisation)."""
        by_type: dict[str, int] = {}
        for t in self.tensors.values():
            by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
        return max(by_type, key=by_type.__getitem__) if by_type else "?"


def _tokenizer_sha(header: GGUFHeader) -> str:
    """Hash of the vocabulary and merges: two files share a tokenizer iff the hashes are equal."""
    h = hashlib.sha256()
    for name in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
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

    tensors: dict[str, TensorInfo] = {}
    for name, (shape, kind, n_bytes, offset) in header.tensors.items():
        tensors[name] = TensorInfo(name, shape, GGUFHeader.type_name(kind), n_bytes)
        if offset + n_bytes > size:
            raise LocalspecError(f"{p}: file is truncated (tensor {name} runs past the end)")

    def meta(template: str) -> Any:
        return kv.get(K.key(template, arch))

    metadata = {k: v for k, v in kv.items() if not k.startswith(K.KEY_TOKENIZER_PREFIX)}
    tokens = kv.get(K.KEY_TOKENIZER_TOKENS)
    n_vocab = len(tokens) if isinstance(tokens, list) else int(meta(K.KEY_VOCAB_SIZE) or 0)

    info: dict[str, Any] = dict(
        path=p,
        arch=arch,
        name=str(kv.get(K.KEY_NAME) or p.stem),
        size_bytes=size,
        n_embd=int(meta(K.KEY_EMBEDDING_LENGTH) or 0),
        n_layer=int(meta(K.KEY_BLOCK_COUNT) or 0),
        n_ctx_train=int(meta(K.KEY_CONTEXT_LENGTH) or 0),
        n_vocab=n_vocab,
        tokenizer_sha256=_tokenizer_sha(header),
        chat_template=kv.get(K.KEY_CHAT_TEMPLATE),
        tensors=tensors,
        metadata=metadata,
    )
    if arch == K.EAGLE3_ARCH:
        layers = meta(K.KEY_TARGET_LAYERS)
        d2t = tensors.get(K.T_D2T)
        info.update(
            target_layers=tuple(int(x) for x in layers) if layers is not None else None,
            target_hidden_size=int(meta(K.KEY_TARGET_HIDDEN_SIZE) or 0) or None,
            variant=str(kv.get(K.KEY_LS_VARIANT) or K.VARIANT_EAGLE3),
            fc_norm=bool(kv.get(K.KEY_LS_FC_NORM) or False),
            fc_norm_eps=kv.get(K.KEY_LS_FC_NORM_EPS),
            norm_output=bool(kv.get(K.KEY_LS_NORM_OUTPUT) or False),
            norm_before_fc=bool(meta(K.KEY_NORM_BEFORE_FC) or False),
            norm_before_residual=bool(meta(K.KEY_NORM_BEFORE_RESIDUAL) or False),
            draft_vocab=d2t.shape[0] if d2t is not None else None,
        )
    return GGUFInfo(**info)


def read_gguf(path: str | Path) -> GGUFInfo:
    """Metadata of a GGUF file, or LocalspecError with one line saying what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LocalspecError(f"{p}: no such file")
    if not p.is_file():
        raise LocalspecError(f"{p}: not a file")
    with open(p, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise LocalspecError(f"{p}: not a GGUF file")
    st = p.stat()
    return _read_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


def read_tensor(info: GGUFInfo, name: str) -> np.ndarray:
    """One tensor's data as numpy (plain-typed tensors only: norms, d2t)."""
    return GGUFHeader(info.path).tensor_data(name)


def check_target(target: GGUFInfo) -> None:
    if target.is_drafter:
        raise LocalspecError(f"{target.path.name} is an EAGLE-3 drafter, not a target model")
    if target.n_vocab <= 0 or target.n_embd <= 0:
        raise LocalspecError(f"{target.path.name}: missing vocabulary or embedding size")


def check_pair(target: GGUFInfo, drafter: GGUFInfo) -> None:
    """Every check that keeps llama.cpp from aborting on a target/drafter mismatch."""
    t, d = target.path.name, drafter.path.name
    check_target(target)
    if not drafter.is_drafter:
        raise LocalspecError(f"{d} is not an EAGLE-3 drafter (architecture '{drafter.arch}')")
    if target.arch not in K.FEATURE_ARCHS:
        raise LocalspecError(
            f"target architecture '{target.arch}' ({t}) cannot export layer features in this llama.cpp; "
            f"EAGLE-3 works with: {', '.join(sorted(K.FEATURE_ARCHS))}"
        )
    layers = drafter.target_layers
    if layers is None or len(layers) != 3:
        raise LocalspecError(f"{d}: eagle3.target_layers must list exactly 3 layers (got {layers})")
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
