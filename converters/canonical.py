"""One description of an EAGLE-3 drafter that every checkpoint layout is converted into.

Layout readers produce a :class:`DrafterWeights`; :mod:`.gguf_writer` turns it into a GGUF that
stock llama.cpp loads as ``eagle3``. Conventions of the canonical form:
- tensors are keyed by their GGUF names (``localspec.formats.gguf_consts.T_*``) and stored as float32 numpy
  arrays in PyTorch orientation (``[out_features, in_features]``);
- q/k projections are already permuted for llama.cpp's rope (``LLAMA_ROPE_TYPE_NORM``);
- EAGLE-3.1 ``fc_norm`` weights are already folded into ``fc.weight`` (``fc_norm`` stays True so
  the runtime applies the weightless per-block RMS scaling);
- ``d2t`` holds ABSOLUTE target token ids (checkpoints store offsets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localspec.formats import gguf_consts as K


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_position: int
    target_hidden_size: int
    target_layers: tuple[int, int, int]
    vocab_size: int                       # the target's vocabulary
    variant: str = K.VARIANT_EAGLE3
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    fc_norm_eps: float | None = None
    norm_output: bool = False
    source_layout: str = ""
    source: str = ""                      # Hub repo id or base name (never a local path)
    source_revision: str = ""             # Hub commit, when known
    # llama3-style rope scaling, as llama.cpp's ``rope_freqs.weight``: one divisor per rotary
    # frequency (head_dim / 2 values); None = plain rope
    rope_freq_factors: tuple[float, ...] | None = None


@dataclass
class DrafterWeights:
    config: DrafterConfig
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    d2t: np.ndarray | None = None         # int64 absolute target ids, one per draft token

    @property
    def draft_vocab(self) -> int:
        return len(self.d2t) if self.d2t is not None else self.config.vocab_size

    def n_params(self) -> int:
        return int(sum(t.size for t in self.tensors.values()))
