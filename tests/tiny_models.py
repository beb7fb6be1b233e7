"""Tiny GGUF models built in tests: a llama-architecture target and EAGLE-3 drafters.

They carry the real SmolLM2 tokenizer (copied from the embedded target) so prompts, chat templates
and d2t mappings are realistic, with 64-wide random weights so they load and run in milliseconds.

Targets:
- ``repeat``: every layer's output projection is zero and embeddings are unit rows, so the residual
  stream stays the token embedding and the target greedily repeats its last token.
- ``noisy``: like ``repeat`` plus random layer outputs: mostly repeats, sometimes does not.
- ``random``: ordinary random weights.

Drafters:
- ``repeat``: fc picks the first feature block and the layer adds nothing, so it predicts "the
  same token again": always right on a ``repeat`` target, partly right on ``noisy``.
- ``random``: random weights (low acceptance).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localspec.formats import gguf_consts as K
from localspec.converters.canonical import DrafterConfig, DrafterWeights
from localspec.converters.gguf_writer import write_drafter_gguf
from localspec.llama.gguf_native import ARRAY, GGUFHeader
from localspec.core.paths import embedded_target

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
N_LAYER = 4


def _copy_tokenizer(writer, source: Path, skip: tuple[str, ...] = ()) -> int:
    import gguf

    header = GGUFHeader(source)
    for key, value in header.kv.items():
        if key.startswith("tokenizer.") and key not in skip:
            kind, sub = header.types[key]
            if kind == ARRAY:
                items = value.tolist() if isinstance(value, np.ndarray) else list(value)
                writer.add_key_value(key, items, gguf.GGUFValueType(kind), sub_type=gguf.GGUFValueType(sub))
            else:
                writer.add_key_value(key, value, gguf.GGUFValueType(kind))
    return len(header.kv["tokenizer.ggml.tokens"])


def write_gguf(writer) -> None:
    """Write out everything added to ``writer`` (a gguf.GGUFWriter) and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def unit_embeddings(n_vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def add_shape(writer, n_layer: int, n_vocab: int, n_ff: int = N_FF) -> None:
    """The tiny targets' hyperparameters (context, widths, heads, norm, rope) on a GGUF writer."""
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(n_vocab)


def build_target(path: Path, kind: str = "repeat", *, arch: str = "llama", seed: int = 0,
                 n_layer: int = N_LAYER, noise: float = 0.35, chat_template: str | None = None,
                 n_ff: int = N_FF) -> Path:
    """A tiny target of ``kind`` (see above); ``n_layer`` and ``n_ff`` make a costlier one."""
    import gguf

    rng = np.random.default_rng(seed + 1)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{kind}")
    n_vocab = _copy_tokenizer(writer, embedded_target(), skip=(K.KEY_CHAT_TEMPLATE,) if chat_template else ())
    if chat_template:
        writer.add_chat_template(chat_template)
    add_shape(writer, n_layer, n_vocab, n_ff)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", unit_embeddings(n_vocab, seed).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    for i in range(n_layer):
        out_scale = {"repeat": 0.0, "noisy": noise, "random": 0.2}[kind]
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rnd(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", rnd(N_EMBD, N_EMBD, scale=out_scale))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(n_ff, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(n_ff, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", rnd(N_EMBD, n_ff, scale=out_scale))
    write_gguf(writer)
    return path


def drafter_weights(kind: str = "repeat", *, variant: str = K.VARIANT_EAGLE3, d2t: np.ndarray | None = None,
                    seed: int = 0, layers: tuple[int, int, int] = (0, 1, N_LAYER - 1),
                    target_hidden: int = N_EMBD, n_vocab: int = 49152) -> DrafterWeights:
    rng = np.random.default_rng(seed + 7)

    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    eagle31 = variant == K.VARIANT_EAGLE31
    config = DrafterConfig(
        hidden_size=N_EMBD, intermediate_size=N_FF, num_heads=N_HEAD, num_kv_heads=N_HEAD_KV, head_dim=HEAD_DIM,
        rms_eps=1e-5, rope_theta=10000.0, max_position=4096, target_hidden_size=target_hidden,
        target_layers=layers, vocab_size=n_vocab, variant=variant, fc_norm=eagle31, fc_norm_eps=1e-5 if eagle31 else None,
        norm_output=eagle31, source_layout="test", source=f"tiny-{kind}",
    )
    t: dict[str, np.ndarray] = {}
    if kind == "repeat":
        fc = np.zeros((N_EMBD, 3 * target_hidden), np.float32)
        fc[:, :N_EMBD] = np.eye(N_EMBD, dtype=np.float32)
        t[K.T_FC] = fc
        t[K.T_O] = np.zeros((N_EMBD, N_EMBD), np.float32)
        t[K.T_FFN_DOWN] = np.zeros((N_EMBD, N_FF), np.float32)
    else:
        t[K.T_FC] = rnd(N_EMBD, 3 * target_hidden, scale=0.05)
        t[K.T_O] = rnd(N_EMBD, N_EMBD)
        t[K.T_FFN_DOWN] = rnd(N_EMBD, N_FF)
    t[K.T_ATTN_NORM] = np.ones(N_EMBD, np.float32)
    t[K.T_HIDDEN_NORM] = np.ones(N_EMBD, np.float32)
    t[K.T_Q] = rnd(N_HEAD * HEAD_DIM, 2 * N_EMBD)
    t[K.T_K] = rnd(N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)
    t[K.T_V] = rnd(N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)
    t[K.T_FFN_NORM] = np.ones(N_EMBD, np.float32)
    t[K.T_FFN_GATE] = rnd(N_FF, N_EMBD)
    t[K.T_FFN_UP] = rnd(N_FF, N_EMBD)
    t[K.T_OUTPUT_NORM] = np.ones(N_EMBD, np.float32)
    if d2t is not None:
        # the draft lm_head: the target's (tied) embedding rows of the draft vocabulary
        t[K.T_OUTPUT] = unit_embeddings(n_vocab, seed)[d2t]
    return DrafterWeights(config, t, d2t.astype(np.int64) if d2t is not None else None)


def build_drafter(path: Path, target: Path, kind: str = "repeat", **kwargs) -> Path:
    return write_drafter_gguf(drafter_weights(kind, **kwargs), target, path, outtype="f32")


def rewrite_gguf(src: Path, dst: Path, changes: dict, tensors: dict | None = None) -> Path:
    """A copy of GGUF ``src`` with metadata changed: ``changes`` maps a key to ``(value, GGUFValueType)``
    (``sub_type`` as a third item for arrays), or to None to drop it. Tensors are copied as they are
    (plain-typed tensors only, as the tiny models have), except those ``tensors`` maps to new data
    (numpy: its dtype is the GGUF type) or to None (dropped)."""
    import gguf

    header = GGUFHeader(src)
    writer = gguf.GGUFWriter(str(dst), str(header.kv["general.architecture"]))
    for key, value in header.kv.items():
        if key == "general.architecture" or key in changes:
            continue
        kind, sub = header.types[key]
        if kind == ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            writer.add_key_value(key, items, gguf.GGUFValueType(kind), sub_type=gguf.GGUFValueType(sub))
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType(kind))
    for key, change in changes.items():
        if change is not None:
            writer.add_key_value(key, change[0], change[1], sub_type=change[2] if len(change) > 2 else None)
    tensors = tensors or {}
    for name in header.tensors:
        data = tensors[name] if name in tensors else header.tensor_data(name)
        if data is not None:
            writer.add_tensor(name, data)
    write_gguf(writer)
    return dst


def repeat_pair(d: Path) -> tuple[Path, Path]:
    """A repeating target and its drafter in ``d`` (t.gguf, d.gguf): the pair the bad-input tests
    start from."""
    target = build_target(d / "t.gguf", "repeat")
    return target, build_drafter(d / "d.gguf", target, "repeat")


def noisy_and_repeat(d: Path) -> dict[str, Path]:
    """A noisy target, a repeating target and its drafter in ``d`` (the pair the logprob and slot
    tests run on): {"noisy", "repeat", "d_repeat"}."""
    paths = {"noisy": build_target(d / "noisy.gguf", "noisy", noise=0.006),
             "repeat": build_target(d / "repeat.gguf", "repeat")}
    paths["d_repeat"] = build_drafter(d / "d_repeat.gguf", paths["repeat"], "repeat")
    return paths
