"""Tiny DFlash and DSpark block drafters for the tiny llama target, written with ``gguf``.

The drafter is llama.cpp's ``dflash`` architecture (``src/models/dflash.cpp``), key for key and
tensor for tensor as the pinned ``convert_hf_to_gguf.py`` writes a z-lab DFlash checkpoint
(``DFlashModel``, a Qwen3 model: per layer ``attn_q/k/v/output``, ``attn_q_norm``/``attn_k_norm``,
the SwiGLU FFN; ``fc`` over the target layers' inputs side by side and its norm
``enc.output_norm``; ``output_norm``; no ``token_embd`` and no ``output``: the target's are read
through ``ctx_other``; ``dflash.block_size``, ``dflash.target_layers`` and the target's tokenizer
with ``tokenizer.ggml.mask_token_id``). A DSpark drafter adds the Markov head (``markov_w1``,
``markov_w2``), optionally the confidence head (``conf_proj`` and its bias) and the keys
``dflash.sample_from_anchor`` / ``dflash.has_confidence_head`` (``DSparkModel``).

Kinds:
- ``repeat``: drafts "the last token again" at every block position, which a ``noisy`` target
  (tests/tiny_models.py) mostly does: Q is zero (attention is uniform over the context and the
  block), the injected context carries no value (``fc`` zero), the mask token's value is projected
  away and the anchor's is scaled up, so every row's state is the anchor's embedding;
- ``random``: random weights everywhere (drafts that depend on the injected features, the
  positions and the block, and that the target almost never accepts: garbage).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tiny_models import N_EMBD, N_FF, N_LAYER, _copy_tokenizer, unit_embeddings, write_gguf
from localspec.core.paths import embedded_target

ARCH = "dflash"
N_HEAD = 4
HEAD_DIM = N_EMBD // N_HEAD
N_DRAFT_LAYER = 2
BLOCK_SIZE = 8
MASK_TOKEN = 4            # a special token of SmolLM2's vocabulary, as published drafters reuse one
TARGET_LAYERS = (1, 3)    # extract ids as the converter writes them (the checkpoint's ids + 1)
MARKOV_RANK = 8
VALUE_GAIN = 2000.0       # repeat: the anchor's value outweighs the mask token's own embedding
NOISE = 0.006             # the noisy target's output scale (it mostly repeats its last token)
# the costly target: as wide (the drafter shares its embeddings and lm_head) but 8 layers of a
# 8192-wide FFN (57 MB, F32): a step of it costs about 8 ms on one thread of this project's CPU,
# twice a DFlash block; the tiny target's step (1 ms) costs a quarter of a block, which reads the
# 49152-token lm_head for every row, and no block can pay there
COSTLY_LAYERS, COSTLY_FF = 8, 8192


def build_dflash(path: Path, target_embd_seed: int = 0, *, kind: str = "repeat", dspark: bool = False,
                 confidence: bool = True, block_size: int = BLOCK_SIZE, layers=TARGET_LAYERS,
                 mask: int = MASK_TOKEN, seed: int = 0, markov_scale: float = 0.05) -> Path:
    """A DFlash drafter (``dspark``: a DSpark one, with its confidence head unless ``confidence``
    is False) for the tiny llama target whose embeddings come from ``target_embd_seed``."""
    import gguf

    rng = np.random.default_rng(seed + 11)

    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(f"tiny-{'dspark' if dspark else 'dflash'}-{kind}")
    writer.add_block_count(N_DRAFT_LAYER)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_uint32(f"{ARCH}.block_size", block_size)
    writer.add_array(f"{ARCH}.target_layers", [int(x) for x in layers])
    if dspark:
        writer.add_bool(f"{ARCH}.sample_from_anchor", True)
        writer.add_bool(f"{ARCH}.has_confidence_head", confidence)
    n_vocab = _copy_tokenizer(writer, embedded_target())
    writer.add_uint32("tokenizer.ggml.mask_token_id", mask)

    embd = unit_embeddings(n_vocab, target_embd_seed).astype(np.float16).astype(np.float32)
    n_in = len(layers) * N_EMBD
    repeat = kind == "repeat"
    if repeat:   # the value of every row but the mask token's: its embedding, scaled up
        e_m = embd[mask] / np.linalg.norm(embd[mask])
        value = (VALUE_GAIN * (np.eye(N_EMBD) - np.outer(e_m, e_m))).astype(np.float32)
    for i in range(N_DRAFT_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((N_EMBD, N_EMBD), np.float32) if repeat else rnd(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", rnd(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", value if repeat and i == 0 else rnd(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight",
                          (np.eye(N_EMBD, dtype=np.float32) if i == 0 else np.zeros((N_EMBD, N_EMBD), np.float32))
                          if repeat else rnd(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
        writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((N_EMBD, N_FF), np.float32) if repeat else rnd(N_EMBD, N_FF))
    writer.add_tensor("fc.weight", np.zeros((N_EMBD, n_in), np.float32) if repeat else rnd(N_EMBD, n_in, scale=0.1))
    writer.add_tensor("enc.output_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    if dspark:
        scale = markov_scale if repeat else 1.0
        writer.add_tensor("markov_w1.weight", rnd(n_vocab, MARKOV_RANK, scale=scale))
        writer.add_tensor("markov_w2.weight", rnd(n_vocab, MARKOV_RANK, scale=scale))
        if confidence:
            writer.add_tensor("conf_proj.weight", rnd(1, N_EMBD + MARKOV_RANK, scale=0.3))
            writer.add_tensor("conf_proj.bias", np.array([0.5], np.float32))
    write_gguf(writer)
    return path


def build_costly_target(path: Path) -> Path:
    """The noisy tiny target made costlier than a block (``COSTLY_LAYERS``, ``COSTLY_FF``), its
    output noise scaled down with its wider FFN and its layers (it mostly repeats its last token)."""
    from tiny_models import build_target

    noise = NOISE * math.sqrt(N_LAYER * N_FF / (COSTLY_LAYERS * COSTLY_FF))
    return build_target(path, "noisy", noise=noise, n_layer=COSTLY_LAYERS, n_ff=COSTLY_FF)


def dflash_set(d: Path) -> dict[str, Path]:
    """The tiny llama targets and block drafters the tests share: {"noisy", "random_target",
    "dflash", "dflash_random", "dspark", "dspark_random", "dspark_noconf"}."""
    from tiny_models import build_target

    paths = {"noisy": build_target(d / "noisy.gguf", "noisy", noise=NOISE),
             "random_target": build_target(d / "random.gguf", "random")}
    paths["dflash"] = build_dflash(d / "dflash.gguf")
    paths["dflash_random"] = build_dflash(d / "dflash_random.gguf", kind="random")
    paths["dspark"] = build_dflash(d / "dspark.gguf", dspark=True)
    paths["dspark_random"] = build_dflash(d / "dspark_random.gguf", kind="random", dspark=True)
    paths["dspark_noconf"] = build_dflash(d / "dspark_noconf.gguf", dspark=True, confidence=False)
    return paths



def tiny_checkpoint(d: Path, layout: str) -> Path:
    """A tiny random checkpoint for the tiny llama target in a published layout: ``zlab`` (z-lab's
    DFlash: no ``model.`` prefix, ``dflash_config``, ``model_type: qwen3`` as z-lab's configs have,
    which llama.cpp's converter reads through transformers' ``AutoConfig``: the context length and
    RoPE base left to ``Qwen3Config``'s defaults here), ``deepseek`` (a DSpark: ``model.`` names, a
    Markov and a confidence head, a full vocabulary, keys at the top level) or ``speculators`` (a
    DSparkSpeculator: ``transformer_layer_config``, ``aux_hidden_state_layer_ids``, a reduced
    vocabulary with ``d2t`` and ``t2d``)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    pre = "" if layout == "zlab" else "model."
    t = {f"{pre}fc.weight": rnd(N_EMBD, 2 * N_EMBD), f"{pre}hidden_norm.weight": torch.ones(N_EMBD),
         f"{pre}norm.weight": torch.ones(N_EMBD)}
    for i in range(N_DRAFT_LAYER):
        p = f"{pre}layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(N_EMBD), p + "post_attention_layernorm.weight": torch.ones(N_EMBD),
                  p + "self_attn.q_proj.weight": rnd(N_EMBD, N_EMBD), p + "self_attn.k_proj.weight": rnd(N_EMBD, N_EMBD),
                  p + "self_attn.v_proj.weight": rnd(N_EMBD, N_EMBD), p + "self_attn.o_proj.weight": rnd(N_EMBD, N_EMBD),
                  p + "self_attn.q_norm.weight": torch.ones(HEAD_DIM), p + "self_attn.k_norm.weight": torch.ones(HEAD_DIM),
                  p + "mlp.gate_proj.weight": rnd(N_FF, N_EMBD), p + "mlp.up_proj.weight": rnd(N_FF, N_EMBD),
                  p + "mlp.down_proj.weight": rnd(N_EMBD, N_FF)})
    shape = {"hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_DRAFT_LAYER,
             "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "max_position_embeddings": 4096, "vocab_size": 49152}
    if layout == "zlab":
        config = dict(shape, architectures=["DFlashDraftModel"], model_type="qwen3", block_size=BLOCK_SIZE,
                      dflash_config={"target_layer_ids": [i - 1 for i in TARGET_LAYERS], "mask_token_id": MASK_TOKEN})
        del config["max_position_embeddings"], config["rope_theta"]
    else:
        vocab = 49152 if layout == "deepseek" else 512
        t.update({"model.markov_head.markov_w1.weight": rnd(49152, MARKOV_RANK),
                  "model.markov_head.markov_w2.weight": rnd(vocab, MARKOV_RANK),
                  "model.confidence_head.proj.weight": rnd(1, N_EMBD + MARKOV_RANK),
                  "model.confidence_head.proj.bias": torch.zeros(1), "lm_head.weight": rnd(vocab, N_EMBD)})
        if layout == "deepseek":
            config = dict(shape, architectures=["DSparkDraftModel"], target_layer_ids=[i - 1 for i in TARGET_LAYERS],
                          mask_token_id=MASK_TOKEN, block_size=7)
        else:
            ids = torch.sort(torch.randperm(49152, generator=g)[:vocab]).values
            t.update({"d2t": ids - torch.arange(vocab), "t2d": torch.zeros(49152, dtype=torch.bool)})
            config = {"architectures": ["DSparkSpeculator"], "transformer_layer_config": shape, "block_size": 7,
                      "aux_hidden_state_layer_ids": list(TARGET_LAYERS), "mask_token_id": MASK_TOKEN,
                      "draft_vocab_size": vocab}
    d.mkdir(parents=True)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config))
    return d


def hf_target(d: Path) -> Path:
    """A tiny random Hugging Face llama target (tests/tiny_models.py's shape) with SmolLM2's
    tokenizer rebuilt as a ``tokenizer.json`` from the embedded GGUF's vocabulary and merges (a
    byte-level BPE behind SmolLM's digit splitting, so llama.cpp's converter recognises its
    pre-tokenizer, ``smollm``): the ``--target-model-dir`` of llama.cpp's DFlash converter."""
    import torch
    from safetensors.torch import save_file

    from localspec.llama.gguf_native import GGUFHeader
    from tiny_models import N_HEAD_KV

    kv = GGUFHeader(embedded_target()).kv
    tokens, types = list(kv["tokenizer.ggml.tokens"]), list(kv["tokenizer.ggml.token_type"])
    special = [i for i, kind in enumerate(types) if kind == 3]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
                 "added_tokens": [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True} for i in special],
                 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                          byte_level]},
                 "post_processor": byte_level, "decoder": byte_level,
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                           "vocab": {tok: i for i, tok in enumerate(tokens)},
                           "merges": [m.split(" ") for m in kv["tokenizer.ggml.merges"]]}}
    d.mkdir(parents=True)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": tokens[1], "eos_token": tokens[2], "unk_token": tokens[0],
        "pad_token": tokens[2], "add_prefix_space": False, "chat_template": kv["tokenizer.chat_template"]}))
    g = torch.Generator().manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    t = {"model.embed_tokens.weight": rnd(len(tokens), N_EMBD), "model.norm.weight": torch.ones(N_EMBD)}
    kv_width = N_HEAD_KV * (N_EMBD // N_HEAD)
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(N_EMBD), p + "post_attention_layernorm.weight": torch.ones(N_EMBD),
                  p + "self_attn.q_proj.weight": rnd(N_EMBD, N_EMBD), p + "self_attn.k_proj.weight": rnd(kv_width, N_EMBD),
                  p + "self_attn.v_proj.weight": rnd(kv_width, N_EMBD), p + "self_attn.o_proj.weight": rnd(N_EMBD, N_EMBD),
                  p + "mlp.gate_proj.weight": rnd(N_FF, N_EMBD), p + "mlp.up_proj.weight": rnd(N_FF, N_EMBD),
                  p + "mlp.down_proj.weight": rnd(N_EMBD, N_FF)})
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": N_EMBD, "intermediate_size": N_FF,
        "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV,
        "head_dim": N_EMBD // N_HEAD, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "vocab_size": len(tokens), "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}))
    return d


assert N_LAYER > max(TARGET_LAYERS)
