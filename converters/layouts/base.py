"""What every EAGLE-3 checkpoint layout shares: one Llama-style decoder layer over
``concat(norm(embedding), norm(g))``, an ``fc`` over three target features, a final norm and a
(possibly reduced-vocabulary) lm_head. A layout module says how its config and tensor names map
onto the reference names (:mod:`..reference`: ``fc``, ``fc_norm.i``, ``enc_norm``, ``midlayer.*``,
``norm``, ``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``) and which target-layer convention its
``eagle_aux_hidden_state_layer_ids`` use; :meth:`Layout.read` does the rest.

Target-layer conventions (llama.cpp's ``eagle3.target_layers`` = the INPUT of target layer ``lid``,
the residual stream before block ``lid`` runs; ``get_embeddings_layer_inp``):
- "input" (ids taken as they are): vLLM captures ``hidden_states + residual`` at the top of block
  ``i`` for every ``i`` in the ids (vLLM's own comment: "capture id k yields the OUTPUT of layer
  k-1"), so vLLM-trained drafters (AngelSlim, speculators, which trains on vLLM-extracted states)
  name layer inputs; so does llama.cpp's own converter (it copies the ids) and localspec's trainer.
- "output" (ids + 1): tools that hook ``layers[i]`` with a forward hook and keep its OUTPUT.
  SpecForge's HF backend does, and SGLang (what SpecForge serves with) adds one to explicit ids
  (``layers_to_capture = [i + 1 ...]``). NVIDIA ModelOpt does too: ``hf_eagle.py`` registers
  ``_collect_aux_hidden_states_forward_hook`` on ``layers[i]`` for ``i`` in
  ``eagle_aux_hidden_state_layer_ids`` (default ``{1, n//2 - 1, n - 4}``), and its hidden-state
  dump helpers say "Callers that index into HuggingFace's outputs.hidden_states tuple must add +1".
  NeMo Automodel's ``HFEagle3TargetModel`` hooks ``layers[i]`` outputs the same way (default
  ``[1, n//2 - 1, n - 4]``). The default ``[1, n//2 - 1, n - 4]`` therefore lands on the inputs of
  ``[2, n//2, n - 3]``, the default of vLLM, SGLang and llama.cpp alike.
- A config may say which it uses: ``"localspec": {"layer_ids": "input"|"output"}`` in config.json
  wins over the layout's convention (localspec's trainer writes ``input``; add it by hand to, e.g.,
  a ModelOpt drafter trained on vLLM-dumped hidden states, which ModelOpt's vLLM path captures with
  the ids as vLLM reads them: inputs).
- No ids in the config: ``(2, n//2, n - 3)`` for every layout (see above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from localspec.formats import gguf_consts as K
from localspec.core.errors import LocalspecError

from ..canonical import DrafterConfig, DrafterWeights
from ..checkpoint import Checkpoint


@dataclass(frozen=True)
class TargetShape:
    name: str
    n_layer: int
    n_embd: int
    n_vocab: int


def default_layers(n_layer: int) -> tuple[int, int, int]:
    return (2, n_layer // 2, n_layer - 3)


def permute_for_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half q/k rows -> llama.cpp rope NORM (interleaved pairs) row order."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, theta: float, scaling: dict[str, Any]) -> tuple[float, ...]:
    """Per-frequency divisors of Llama 3 rope scaling (what llama.cpp stores as rope_freqs)."""
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (theta ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


_MIDLAYER = (
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
# tensors a checkpoint may carry that the drafter does not use at inference
_IGNORED = ("t2d", "verifier_lm_head.weight", "verifier_norm.weight")
# name fragments of things llama.cpp's eagle3 graph cannot run, with what to call them
_UNSUPPORTED_KEYS = (
    ("q_norm", "q/k norms in attention"), ("k_norm", "q/k norms in attention"),
    ("q_a_proj", "MLA attention"), ("kv_a_proj", "MLA attention"), ("kv_b_proj", "MLA attention"),
    (".bias", "biases in attention or MLP"), ("mask_hidden", "parallel drafting (P-EAGLE)"),
    ("weight_scale", "quantized weights"), ("input_scale", "quantized weights"), ("qweight", "quantized weights"),
    ("experts", "a mixture-of-experts drafter layer"),
)


def _truthy(v: Any) -> bool:
    return bool(v) and v not in ("false", "False", "0")


class Layout:
    """Base: a layout module subclasses this and overrides the class attributes / hooks."""

    name: ClassVar[str] = "?"
    description: ClassVar[str] = ""
    # how to read eagle_aux_hidden_state_layer_ids: "input" (as they are) or "output" (+1)
    layer_convention: ClassVar[str] = "input"

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.warnings: list[str] = []
        self.hp = self.hparams()
        self.names = self.rename()

    # ---- hooks ----------------------------------------------------------------------------
    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        raise NotImplementedError

    def hparams(self) -> dict[str, Any]:
        """The config flattened into one dict (nested sub-configs merged)."""
        return dict(self.ckpt.config)

    def flag(self, key: str) -> bool:
        eagle = self.hp.get("eagle_config") or {}
        return _truthy(self.hp.get(key, eagle.get(key, False)))

    def rename(self) -> dict[str, str]:
        """reference name -> checkpoint name."""
        out: dict[str, str] = {}
        for name in self.ckpt.names():
            ref = name
            if ref.startswith("model."):          # NeMo Automodel / HF-style wrappers
                ref = ref[len("model."):]
            if ref.startswith("layers.0."):        # vLLM / speculators
                ref = "midlayer." + ref[len("layers.0."):]
            elif ref == "input_norm.weight":       # norm_before_fc (ModelOpt, speculators)
                ref = "enc_norm.weight"
            elif ref == "draft_id_to_target_id":
                ref = "d2t"
            if ref in out:
                raise LocalspecError(f"{self.ckpt.root}: tensors {out[ref]} and {name} are the same parameter")
            out[ref] = name
        return out

    def extra_checks(self) -> None:
        """Layout-specific refusals and warnings."""

    # ---- shared reading -------------------------------------------------------------------
    def _refuse(self, what: str) -> None:
        raise LocalspecError(f"{self.ckpt.root}: {self.name} drafter uses {what}, which llama.cpp's eagle3 cannot run exactly")

    def check_supported(self) -> None:
        hp, eagle = self.hp, self.hp.get("eagle_config") or {}
        for ref, name in self.names.items():
            if ref.startswith("layers."):
                self._refuse(f"more than one decoder layer (found {name})")
            for frag, what in _UNSUPPORTED_KEYS:
                if frag in ref:
                    self._refuse(f"{what} (tensor {name})")
        n_layers = hp.get("num_hidden_layers", 1)
        if n_layers not in (None, 1):
            self._refuse(f"{n_layers} decoder layers (llama.cpp's eagle3 has exactly one)")
        for key, what in (("kv_lora_rank", "MLA attention"), ("q_lora_rank", "MLA attention")):
            if hp.get(key):
                self._refuse(f"{what} ({key}={hp[key]})")
        for key in ("attention_bias", "mlp_bias", "qk_norm", "use_qk_norm", "parallel_drafting"):
            if _truthy(hp.get(key)) or _truthy(eagle.get(key)):
                self._refuse(f"{key}=true")
        act = hp.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            self._refuse(f"activation '{act}' (only SiLU/SwiGLU)")
        if hp.get("partial_rotary_factor") not in (None, 1, 1.0):
            self._refuse(f"partial rotary embeddings (partial_rotary_factor={hp['partial_rotary_factor']})")
        if hp.get("logit_scale") not in (None, 1, 1.0):
            self._refuse(f"logit_scale={hp['logit_scale']}")
        if _truthy(hp.get("use_sliding_window")) and hp.get("sliding_window"):
            self._refuse(f"sliding-window attention (sliding_window={hp['sliding_window']})")
        if any("sliding" in str(t) for t in hp.get("layer_types") or []):
            self._refuse("sliding-window attention (layer_types)")
        if eagle.get("use_aux_hidden_state") is False:
            self._refuse("use_aux_hidden_state=false (EAGLE-1/2 style features)")
        if eagle.get("use_input_layernorm_in_first_layer") is False:
            self._refuse("use_input_layernorm_in_first_layer=false")
        if eagle.get("use_last_layernorm") is False:
            self._refuse("use_last_layernorm=false")
        if _truthy(eagle.get("use_mtp_layernorm")):
            self._refuse("use_mtp_layernorm=true")
        if self.flag("fc_norm") and self.flag("norm_before_fc"):
            self._refuse("both fc_norm and norm_before_fc")

    def rope(self, head_dim: int) -> tuple[float, tuple[float, ...] | None]:
        hp = self.hp
        params = hp.get("rope_parameters") if isinstance(hp.get("rope_parameters"), dict) else {}
        scaling = hp.get("rope_scaling") or (params if params.get("rope_type") not in (None, "default") else None)
        theta = float(hp.get("rope_theta") or params.get("rope_theta") or 10000.0)
        if not scaling:
            return theta, None
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind in (None, "default"):
            return theta, None
        if kind == "llama3":
            return theta, llama3_rope_factors(head_dim, theta, scaling)
        self._refuse(f"rope scaling '{kind}' (only none and llama3 are converted)")
        raise AssertionError

    def convention(self) -> str:
        """How this checkpoint's ids read: the config's own ``localspec.layer_ids`` marker, else the
        layout's convention."""
        marker = self.ckpt.config.get("localspec")
        said = marker.get("layer_ids") if isinstance(marker, dict) else None
        if said is not None and said not in ("input", "output"):
            raise LocalspecError(f"{self.ckpt.root}/config.json: localspec.layer_ids must be \"input\" or \"output\" (got {said!r})")
        return said or self.layer_convention

    def layer_ids(self, target: TargetShape) -> tuple[int, int, int]:
        eagle = self.hp.get("eagle_config") or {}
        ids = self.hp.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        if not ids:
            return default_layers(target.n_layer)
        if len(ids) != 3 or not all(isinstance(i, int) for i in ids):
            raise LocalspecError(f"{self.ckpt.root}: eagle_aux_hidden_state_layer_ids must be 3 integers (got {ids})")
        shift = 1 if self.convention() == "output" else 0
        lids = tuple(int(i) + shift for i in ids)
        bad = [lid for lid in lids if not 0 <= lid < target.n_layer]
        if bad:
            how = f" (ids {list(ids)} name layer outputs: inputs of {list(lids)})" if shift else ""
            raise LocalspecError(
                f"{self.ckpt.root}: target layers {list(lids)}{how} out of range for {target.name} "
                f"({target.n_layer} layers): wrong target?"
            )
        return lids  # type: ignore[return-value]

    def _get(self, ref: str, shape: tuple[int, ...], required: bool = True) -> np.ndarray | None:
        name = self.names.get(ref)
        if name is None:
            if required:
                raise LocalspecError(f"{self.ckpt.root}: missing tensor {ref} ({self.name} layout)")
            return None
        got = self.ckpt.shapes[name]
        if tuple(got) != tuple(shape):
            raise LocalspecError(
                f"{self.ckpt.files[name]}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
            )
        data = self.ckpt.tensor(name)
        if data.dtype.kind == "f" and not np.isfinite(data).all():
            bad = int((~np.isfinite(data)).sum())
            raise LocalspecError(f"{self.ckpt.files[name]}: tensor {name} has {bad} NaN/Inf values")
        return data

    def _int(self, key: str, default: Any = None) -> int:
        v = self.hp.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise LocalspecError(f"{self.ckpt.root}/config.json: '{key}' must be a positive integer (got {v!r})")
        return v

    def read(self, target: TargetShape) -> DrafterWeights:
        self.check_supported()
        self.extra_checks()
        self._check_known_tensors()
        cfg = self._config(target)
        absolute, draft_vocab = self._draft_vocab(cfg.vocab_size)
        return DrafterWeights(cfg, self._tensors(cfg, draft_vocab, target), absolute)

    def _check_known_tensors(self) -> None:
        known = {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "enc_norm.weight"}
        known |= {f"fc_norm.{i}.weight" for i in range(3)} | {f"midlayer.{m}" for m in _MIDLAYER}
        unknown = [self.names[r] for r in self.names if r not in known and r not in _IGNORED
                   and not r.endswith("rotary_emb.inv_freq")]
        if unknown:
            raise LocalspecError(
                f"{self.ckpt.root}: unexpected tensors for a {self.name} drafter: {', '.join(sorted(unknown)[:5])}"
                + (" ..." if len(unknown) > 5 else "")
            )

    def _shape(self, target: TargetShape) -> dict[str, Any]:
        """The config's sizes, checked against each other and against the target."""
        hp = self.hp
        h = self._int("hidden_size")
        n_head = self._int("num_attention_heads")
        n_kv = self._int("num_key_value_heads", n_head)
        head_dim = int(hp.get("head_dim") or h // n_head)
        ff = self._int("intermediate_size")
        vocab = self._int("vocab_size")
        ht = int(hp.get("target_hidden_size") or h)
        if n_head % n_kv:
            raise LocalspecError(f"{self.ckpt.root}/config.json: {n_head} heads are not a multiple of {n_kv} kv heads")
        if head_dim % 2:
            raise LocalspecError(f"{self.ckpt.root}/config.json: head_dim {head_dim} is odd")
        if ht != target.n_embd:
            raise LocalspecError(
                f"{self.ckpt.root}: drafter takes target features of width {ht}, {target.name} has hidden size "
                f"{target.n_embd}: wrong target?"
            )
        if vocab != target.n_vocab:
            raise LocalspecError(
                f"{self.ckpt.root}: drafter was made for a {vocab}-token vocabulary, {target.name} has "
                f"{target.n_vocab}: wrong target?"
            )
        return dict(hidden_size=h, intermediate_size=ff, num_heads=n_head,
                    num_kv_heads=n_kv, head_dim=head_dim, target_hidden_size=ht, vocab_size=vocab)

    def _norms(self) -> tuple[bool, bool, bool]:
        """(fc_norm, norm_before_fc, norm_output), checked against the weights present."""
        hp = self.hp
        has_fc_norm = any(f"fc_norm.{i}.weight" in self.names for i in range(3))
        if "fc_norm" in hp or "fc_norm" in (hp.get("eagle_config") or {}):
            fc_norm = self.flag("fc_norm")
        else:  # EAGLE-3.1 checkpoints that state fc_norm only through its weights
            fc_norm = has_fc_norm
            if has_fc_norm and self.name != "localspec":
                self.warnings.append("fc_norm weights present but config.json has no fc_norm key: applied")
        norm_before_fc = self.flag("norm_before_fc")
        if fc_norm and not all(f"fc_norm.{i}.weight" in self.names for i in range(3)):
            raise LocalspecError(f"{self.ckpt.root}: config sets fc_norm but fc_norm.{{0,1,2}}.weight are missing")
        if not fc_norm and has_fc_norm:
            raise LocalspecError(f"{self.ckpt.root}: checkpoint has fc_norm weights but config.json sets fc_norm=false")
        if norm_before_fc != ("enc_norm.weight" in self.names):
            raise LocalspecError(
                f"{self.ckpt.root}: norm_before_fc is {norm_before_fc} in config.json but input_norm.weight is "
                f"{'absent' if norm_before_fc else 'present'}"
            )
        return fc_norm, norm_before_fc, self.flag("norm_output")

    def _config(self, target: TargetShape) -> DrafterConfig:
        hp = self.hp
        shape = self._shape(target)
        eps = float(hp.get("rms_norm_eps", 1e-6))
        layers = self.layer_ids(target)
        theta, factors = self.rope(shape["head_dim"])
        fc_norm, norm_before_fc, norm_output = self._norms()
        return DrafterConfig(
            **shape, rms_eps=eps, rope_theta=theta, max_position=int(hp.get("max_position_embeddings") or 4096),
            target_layers=layers, variant=K.VARIANT_EAGLE31 if (fc_norm or norm_output) else K.VARIANT_EAGLE3,
            norm_before_fc=norm_before_fc, norm_before_residual=self.flag("norm_before_residual"),
            fc_norm=fc_norm, fc_norm_eps=float(hp.get("fc_norm_eps", eps)) if fc_norm else None,
            norm_output=norm_output, source_layout=self.name, source=self.ckpt.provenance,
            source_revision=self.ckpt.revision,
            rope_freq_factors=factors,
        )

    def _draft_vocab(self, vocab: int) -> tuple[np.ndarray | None, int]:
        """(the draft tokens' absolute target ids, None for the whole vocabulary; the draft vocabulary's size)."""
        lm_name = self.names.get("lm_head.weight")
        if lm_name is None:
            raise LocalspecError(f"{self.ckpt.root}: missing tensor lm_head.weight (tied heads are not supported)")
        dv_cfg = self.hp.get("draft_vocab_size") or vocab
        dv = self.ckpt.shapes[lm_name][0]
        if dv != dv_cfg:
            raise LocalspecError(f"{self.ckpt.files[lm_name]}: lm_head has {dv} rows, config.json says draft_vocab_size {dv_cfg}")
        d2t = self._get("d2t", (dv,), required=False)
        if d2t is None:
            if dv != vocab:
                raise LocalspecError(f"{self.ckpt.root}: lm_head has {dv} rows (a reduced vocabulary) but there is no d2t mapping")
            return None, dv
        absolute = np.arange(dv, dtype=np.int64) + d2t.astype(np.int64)
        if absolute.min() < 0 or absolute.max() >= vocab:
            raise LocalspecError(f"{self.ckpt.files[self.names['d2t']]}: d2t maps draft tokens outside the target vocabulary 0..{vocab - 1}")
        if len(np.unique(absolute)) != dv:
            raise LocalspecError(f"{self.ckpt.files[self.names['d2t']]}: d2t maps two draft tokens to the same target token")
        t2d_name = self.names.get("t2d")
        if t2d_name is not None and self.ckpt.shapes[t2d_name] == (vocab,):
            t2d = self.ckpt.tensor(t2d_name).astype(bool)
            if int(t2d.sum()) != dv or not t2d[absolute].all():
                self.warnings.append("t2d disagrees with d2t; d2t (what runtimes use) was kept")
        return absolute, dv

    def _tensors(self, cfg: DrafterConfig, dv: int, target: TargetShape) -> dict[str, np.ndarray]:
        """The GGUF tensors by llama.cpp name (q/k rows permuted, fc_norm folded into fc)."""
        h, ht, ff, vocab = cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size, cfg.vocab_size
        n_head, n_kv, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        t: dict[str, np.ndarray] = {}
        fc = self._get("fc.weight", (h, 3 * ht))
        if cfg.fc_norm:
            fc = fc.copy()
            for i in range(3):
                w = self._get(f"fc_norm.{i}.weight", (ht,))
                fc[:, i * ht:(i + 1) * ht] *= w[None, :]
        t[K.T_FC] = fc
        if cfg.norm_before_fc:
            t[K.T_ENC_NORM] = self._get("enc_norm.weight", (3 * ht,))
        m = "midlayer."
        t[K.T_ATTN_NORM] = self._get(m + "input_layernorm.weight", (h,))
        t[K.T_HIDDEN_NORM] = self._get(m + "hidden_norm.weight", (h,))
        t[K.T_Q] = permute_for_llama_cpp(self._get(m + "self_attn.q_proj.weight", (n_head * head_dim, 2 * h)), n_head)
        t[K.T_K] = permute_for_llama_cpp(self._get(m + "self_attn.k_proj.weight", (n_kv * head_dim, 2 * h)), n_kv)
        t[K.T_V] = self._get(m + "self_attn.v_proj.weight", (n_kv * head_dim, 2 * h))
        t[K.T_O] = self._get(m + "self_attn.o_proj.weight", (h, n_head * head_dim))
        t[K.T_FFN_NORM] = self._get(m + "post_attention_layernorm.weight", (h,))
        t[K.T_FFN_GATE] = self._get(m + "mlp.gate_proj.weight", (ff, h))
        t[K.T_FFN_UP] = self._get(m + "mlp.up_proj.weight", (ff, h))
        t[K.T_FFN_DOWN] = self._get(m + "mlp.down_proj.weight", (h, ff))
        t[K.T_OUTPUT_NORM] = self._get("norm.weight", (h,))
        t[K.T_OUTPUT] = self._get("lm_head.weight", (dv, h))
        embd = self._get("embed_tokens.weight", (vocab, h), required=False)
        if embd is not None:
            t[K.T_TOKEN_EMBD] = embd
        elif h != target.n_embd:
            raise LocalspecError(
                f"{self.ckpt.root}: drafter has no embed_tokens and its hidden size {h} differs from "
                f"{target.name}'s {target.n_embd}, so it cannot borrow the target's embeddings"
            )
        if cfg.rope_freq_factors is not None:
            t[K.T_ROPE_FREQS] = np.asarray(cfg.rope_freq_factors, dtype=np.float32)
        return t
