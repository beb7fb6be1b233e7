"""The EAGLE-3 / EAGLE-3.1 drafter: a :class:`~.drafter.ModelDrafter` with EAGLE's part, the
target's three layer features and the ``fc`` encode (:class:`EagleKind`).

Convention (as in llama.cpp's ``common/speculative.cpp``): the drafter's KV cache holds at position
``P`` the pair (token at ``P+1``, ``g`` at ``P``), where ``g`` is the fc projection of the target's
three layer features at ``P`` for committed positions, or the drafter's own fed-back hidden state
for drafted ones. The output at ``P`` predicts the token at ``P+2``.

EAGLE-3.1 drafters, run exactly without patching llama.cpp:
- ``fc_norm`` (an RMSNorm with its own weight on each of the three target features): the weights
  were folded into ``fc.weight`` at conversion; here each feature block is divided by its RMS.
- ``norm_output`` (feed back the post-norm state): ``output_norm`` is applied to the pre-norm state
  that llama.cpp returns before it is fed to the next step.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import LocalspecError
from ..formats import gguf_consts as K
from ..formats.gguf_info import GGUFInfo, read_tensor
from ..llama import hostloop, llama_ext
from ..llama.contexts import DRAFTER_CONTEXT
from ..llama.llama_model import Context, Model
from .drafter import ALL_OUTPUT_ROWS, TREE_SEQS, DrafterKind, DrafterSequence, ModelDrafter, assembled, checked, open_context  # noqa: F401 (re-exported)

EAGLE = "eagle"


class EagleKind(DrafterKind):
    """EAGLE-3/3.1's part: the target's three layer inputs as features (each block RMS-scaled
    for EAGLE-3.1's ``fc_norm``), the ``fc`` ENCODE graph over them, EAGLE-3.1's ``norm_output``
    on the fed-back state."""

    name = EAGLE
    direct = True   # token rows n_embd wide (eagle3's n_embd_inp), encode rows its fc input (n_embd_inp_enc)

    def __init__(self, info: GGUFInfo, model: Model, target: Context) -> None:
        self.info, self.target = info, target
        self.layers = llama_ext.model_target_layer_ids(model.ptr)
        self.n_embd, self.n_embd_tgt = model.n_embd, target.model.n_embd
        rms_eps = float(info.metadata.get(K.key(K.KEY_RMS_EPS, K.EAGLE3_ARCH), 1e-6))
        self.fc_norm_eps = float(info.fc_norm_eps) if info.fc_norm_eps is not None else rms_eps
        self.out_norm_eps = rms_eps
        self.out_norm = (np.ascontiguousarray(read_tensor(info, K.T_OUTPUT_NORM), dtype=np.float32)
                         if info.norm_output else None)
        self.state_norm = (None if self.out_norm is None else self.out_norm.ctypes.data, self.out_norm_eps)

    def check(self, d: ModelDrafter) -> None:
        """The target layers llama.cpp reads are the metadata's; they and the drafter's state are
        turned on."""
        if tuple(self.layers) != tuple(self.info.target_layers or ()):
            raise LocalspecError(f"{self.info.path.name}: llama.cpp reads target layers {self.layers}, "
                                 f"metadata says {self.info.target_layers}")
        for lid in self.layers:
            llama_ext.set_embeddings_layer_inp(self.target.ptr, lid, True)
        llama_ext.set_embeddings_nextn(d.ctx.ptr, True, True)

    def layer_inputs(self) -> tuple[tuple[int, ...], int, float | None]:
        """The three target layer inputs (:meth:`features`); fc_norm: each block divided by its RMS."""
        return self.layers, self.n_embd_tgt, self.fc_norm_eps if self.info.fc_norm else None

    def encode(self, d: ModelDrafter, features: np.ndarray, who: DrafterSequence) -> np.ndarray:
        """fc over target features: one ``g`` row per feature row, after the pairs of ``who``."""
        return self.encode_groups(d, [(who, features)])[0]

    def encode_groups(self, d: ModelDrafter, groups: list[tuple[DrafterSequence, np.ndarray]]) -> list[np.ndarray]:
        """fc over several sequences' target features in one encode (``n_batch`` rows a chunk);
        per group its ``g`` rows. The fc graph reads rows one at a time, but llama.cpp wants each
        sequence's rows of an encode right after the pairs it holds: in every chunk they start
        there again (an encode writes nothing)."""
        one = len(groups) == 1
        features = groups[0][1] if one else np.concatenate([f for _, f in groups])
        n = features.shape[0]
        seqs = np.empty(n, dtype=np.int32)
        positions = np.empty(n, dtype=np.int32)
        spans, at = [], 0
        for who, f in groups:
            seqs[at:at + len(f)] = who.seq
            spans.append((at, at + len(f), d.ctx.pos_max(who.seq) + 1))
            at += len(f)
        out = np.empty((n, self.n_embd), dtype=np.float32)
        payer = groups[0][0] if one else [who for who, _ in groups]
        step = d.ctx.n_batch
        for start in range(0, n, step):
            end = min(start + step, n)
            for lo, hi, first in spans:
                a, b = max(lo, start), min(hi, end)
                if a < b:
                    positions[a:b] = np.arange(first, first + b - a, dtype=np.int32)
            chunk = np.ascontiguousarray(features[start:end], dtype=np.float32)
            d.encode_rows(seqs[start:end], chunk, positions[start:end], payer)
            address = llama_ext.nextn_address(d.ctx.ptr)
            if not address:
                raise LocalspecError("the drafter encoder produced no output")
            out[start:end] = llama_ext.float_view(address, (end - start, self.n_embd), d.views)
        if one:
            return [out]
        return np.split(out, [hi for _, hi, _ in spans[:-1]])

    def state(self, src: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """EAGLE-3's pre-norm state as it is; EAGLE-3.1's after ``output_norm`` (into ``out``
        where given: the next step's batch row)."""
        if self.out_norm is None:
            return src.copy() if out is None else np.copyto(out, src) or out
        if hostloop.normed_state is not None:   # C, as the greedy chain's (llama.hostloop): the same bits
            if out is None:
                out = np.empty(self.n_embd, dtype=np.float32)
            hostloop.normed_state(out, src, self.state_norm[0], self.out_norm_eps)
            return out
        x = float(np.dot(src, src))
        state = np.multiply(src, self.out_norm, out=out)
        state *= 1.0 / math.sqrt(x / self.n_embd + self.out_norm_eps)   # a Python float: no numpy scalars
        return state


def EagleDrafter(info: GGUFInfo, target: Context, *, n_ctx: int, n_batch: int, n_threads: int | None = None,
                 n_gpu_layers: int = 0, slots: int = 1) -> ModelDrafter:
    """An EAGLE drafter file opened beside ``target``: its own model and context, ``slots``
    sequences for generations (each up to ``n_ctx`` positions, in one unified pool)."""
    llama_ext.check_available()
    model = Model(info.path, n_gpu_layers=n_gpu_layers)
    settings = dict(DRAFTER_CONTEXT, n_seq_max=max(DRAFTER_CONTEXT["n_seq_max"], slots))
    # llama.cpp gives an eagle3 context (an "encoder" model to it: llama_model_has_encoder) n_batch
    # logit rows whatever n_outputs_max asks, and reserves a row per sequence at creation:
    # GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) aborted serve --parallel 65..256. A
    # batch as large as the slots holds them (the rows' buffer grows by a vocabulary row per slot).
    ctx = open_context(model, target, n_ctx=n_ctx * slots, n_batch=max(n_batch, settings["n_seq_max"]),
                       n_threads=n_threads, **settings)
    return assembled(model, ctx, target, lambda: EagleKind(info, model, target))
