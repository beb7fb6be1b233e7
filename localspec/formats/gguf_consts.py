"""Names that localspec reads and writes in GGUF files, in one place.

The ``gguf`` package (0.19) has no EAGLE-3 constants, so the drafter architecture's keys and
tensor names are spelled here, as llama.cpp's ``src/llama-arch.cpp`` (vendored in
llama-cpp-python 0.3.36) defines them. Keys under ``localspec.`` are our own: stock llama.cpp
ignores unknown metadata, so a drafter we write still loads there.
"""

EAGLE3_ARCH = "eagle3"
# Gemma 4 and its assistant drafter, a separate GGUF (llama.cpp's gemma4-assistant)
GEMMA4_ARCH = "gemma4"
GEMMA4_ASSISTANT_ARCH = "gemma4-assistant"

# llama.cpp's eagle3 metadata ("%s" is the architecture name)
KEY_TARGET_LAYERS = "{arch}.target_layers"
KEY_TARGET_HIDDEN_SIZE = "{arch}.target_hidden_size"
KEY_NORM_BEFORE_RESIDUAL = "{arch}.norm_before_residual"
KEY_NORM_BEFORE_FC = "{arch}.norm_before_fc"

# generic llama-style keys used for checks
KEY_ARCH = "general.architecture"
KEY_NAME = "general.name"
KEY_FILE_TYPE = "general.file_type"
KEY_EMBEDDING_LENGTH = "{arch}.embedding_length"
KEY_BLOCK_COUNT = "{arch}.block_count"
KEY_CONTEXT_LENGTH = "{arch}.context_length"
KEY_FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
KEY_HEAD_COUNT = "{arch}.attention.head_count"
KEY_HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
KEY_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
KEY_KEY_LENGTH = "{arch}.attention.key_length"
KEY_VALUE_LENGTH = "{arch}.attention.value_length"
KEY_ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
KEY_ROPE_FREQ_BASE = "{arch}.rope.freq_base"
KEY_SLIDING_WINDOW = "{arch}.attention.sliding_window"
KEY_SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"   # one bool per layer
KEY_KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"
KEY_EMBEDDING_LENGTH_OUT = "{arch}.embedding_length_out"   # gemma4-assistant: the target's width
KEY_SSM_PREFIX = "{arch}.ssm."            # recurrent-state models (no KV cache to plan)
KEY_RWKV_PREFIX = "{arch}.rwkv"
KEY_VOCAB_SIZE = "{arch}.vocab_size"
KEY_NEXTN_PREDICT_LAYERS = "{arch}.nextn_predict_layers"
KEY_SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"        # gemma4: the last layers reuse earlier KV
KEY_FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"    # hybrids: every n-th layer attends
KEY_RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"        # hybrids: per layer, recurrent or not
KEY_SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"              # gated delta nets: value heads
KEY_SSM_GROUP_COUNT = "{arch}.ssm.group_count"                    # gated delta nets: key heads
KEY_SSM_INNER_SIZE = "{arch}.ssm.inner_size"
KEY_EXPERT_COUNT = "{arch}.expert_count"
KEY_EXPERT_USED_COUNT = "{arch}.expert_used_count"
KEY_EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
KEY_EXPERT_GROUP_COUNT = "{arch}.expert_group_count"
KEY_EXPERT_GROUP_USED_COUNT = "{arch}.expert_group_used_count"
KEY_ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"
KEY_TOKENIZER_MODEL = "tokenizer.ggml.model"
KEY_TOKENIZER_TOKENS = "tokenizer.ggml.tokens"
KEY_TOKENIZER_MERGES = "tokenizer.ggml.merges"
KEY_TOKENIZER_PREFIX = "tokenizer."

# localspec's own drafter metadata
KEY_LS_VARIANT = "localspec.eagle.variant"            # "eagle3" | "eagle3.1"
KEY_LS_FC_NORM = "localspec.eagle.fc_norm"             # bool: runtime applies per-layer RMS scaling
KEY_LS_FC_NORM_EPS = "localspec.eagle.fc_norm_eps"     # float32
KEY_LS_NORM_OUTPUT = "localspec.eagle.norm_output"     # bool: feed back the post-norm state
KEY_LS_SOURCE_LAYOUT = "localspec.eagle.source_layout" # str: checkpoint layout converted from
KEY_LS_SOURCE = "localspec.eagle.source"               # str: Hub repo id or base name (no path)
KEY_LS_SOURCE_REVISION = "localspec.eagle.source_revision"  # str: Hub commit of the source
KEY_LS_TARGET_TOKENIZER_SHA = "localspec.eagle.target_tokenizer_sha256"

VARIANT_EAGLE3 = "eagle3"
VARIANT_EAGLE31 = "eagle3.1"

# eagle3 tensors
T_FC = "fc.weight"
T_NEXTN_EH_PROJ = "nextn.eh_proj.weight"   # an MTP head's block: blk.{n}.nextn.eh_proj.weight
T_NEXTN_ENORM = "nextn.enorm.weight"
T_NEXTN_HNORM = "nextn.hnorm.weight"
NEXTN_TENSORS = (T_NEXTN_EH_PROJ, T_NEXTN_ENORM, T_NEXTN_HNORM)   # each MTP graph asserts all three
T_NEXTN_PROJ_PRE = "nextn.pre_projection.weight"     # gemma4-assistant: [token embedding, target state] in
T_NEXTN_PROJ_POST = "nextn.post_projection.weight"   # gemma4-assistant: its state out, at the target's width
T_ENC_NORM = "enc.output_norm.weight"
T_D2T = "d2t"
T_TOKEN_EMBD = "token_embd.weight"
T_OUTPUT = "output.weight"
T_OUTPUT_NORM = "output_norm.weight"
T_ATTN_NORM = "blk.0.attn_norm.weight"
T_HIDDEN_NORM = "blk.0.attn_norm_2.weight"
T_Q = "blk.0.attn_q.weight"
T_K = "blk.0.attn_k.weight"
T_V = "blk.0.attn_v.weight"
T_O = "blk.0.attn_output.weight"
T_FFN_NORM = "blk.0.ffn_norm.weight"
T_FFN_GATE = "blk.0.ffn_gate.weight"
T_FFN_UP = "blk.0.ffn_up.weight"
T_FFN_DOWN = "blk.0.ffn_down.weight"
T_ROPE_FREQS = "rope_freqs.weight"

# What llama.cpp asserts (GGML_ASSERT: the process aborts) rather than reports:
MAX_LAYERS = 512        # LLAMA_MAX_LAYERS (llama-hparams.h)
MAX_EXPERTS = 1024      # LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# the graph asserts n_embd_head_v == n_embd_head_k (src/models/<arch>.cpp; lfm2: the KV widths) ...
SAME_KV_HEAD_ARCHS = frozenset({
    "eagle3", "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "hunyuan-vl", "lfm2", "dflash",
})
# ... and these also that RoPE spans the whole head (n_embd_head == n_rot)
ROT_IS_HEAD_ARCHS = frozenset({"llama", "qwen3", "qwen3moe", "hunyuan-vl"})
NON_WEIGHT_TYPES = frozenset({"I8", "I16", "I32", "I64", "F64"})   # no matrix product on the CPU
D2T_TYPE = "I64"        # eagle3.cpp: GGML_ASSERT(model.d2t->type == GGML_TYPE_I64)

# Layer patterns each architecture's llama.cpp loader, cache or graph asserts on (or divides by),
# checked before it loads a target (localspec.formats.layer_checks; docs/design-notes.md):
# the ones whose MTP graph runs any of several NextN blocks (nextn_layer_offset); every other one
# asserts n_layer_nextn == 1 when it drafts
MTP_CHAINED_ARCHS = frozenset({"step35", "hy-v3", "mimo2"})
# targets with attention in every layer beside FEATURE_ARCHS: their heads checked as those are
# (gemma2 and gemma3 also divide embedding_length by the first layer's head count)
ATTENTION_ARCHS = frozenset({"llama", "step35", "gemma2", "gemma3"})
# the ones that always attend through sliding windows (swa_type STANDARD in load_arch_hparams): the
# cache asserts some layer slides (GGML_ASSERT(hparams.is_swa_any()))
SWA_ARCHS = frozenset({"step35", "gemma4"})
# ... and those that do when attention.sliding_window > 0, with the layer period their loader
# falls back to when sliding_window_pattern is not an array (period 1: no layer slides)
SWA_IF_WINDOW_ARCHS = {"gemma3": 6}
# the last shared_kv_layers layers reuse the KV of the last sliding / full layer before them
SHARED_KV_ARCHS = frozenset({"gemma4"})
# hybrids marking recurrent layers as (i + 1) % full_attention_interval != 0 when
# attention.recurrent_layers is absent (a division by the interval)
INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# gated delta nets: head size inner_size / time_step_rank, time_step_rank % group_count asserted
DELTA_NET_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
# MoE loaders sizing an expert as feed_forward_length / expert_used_count (of the first layer)
# when expert_feed_forward_length is not given
EXPERT_FF_ARCHS = frozenset({"qwen3moe", "qwen35moe", "qwen3next", "qwen4exp"})

# Recurrent-state architectures whose state the pinned llama.cpp rolls back to a draft's position
# (n_rs_seq snapshots; src/llama-arch.cpp llm_arch_supports_rs_rollback): the others of them
# (qwen3next, mamba, rwkv ...) cannot verify a draft (localspec.runtime.recurrent)
RS_ROLLBACK_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3", "kimi-k3",
})

# Target architectures whose llama.cpp graph records every layer's input (``t_layer_inp``), which
# the EAGLE-3 feature extraction reads. Taken from src/models/*.cpp of the vendored llama.cpp: a
# target outside this set aborts the process on the first decode, so it is refused before loading.
FEATURE_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4",
    "gpt-oss", "deepseek4", "lfm2", "minimax-01", "minimax-m2", "mimo2", "nemotron_h",
    "nanbeige", "hunyuan-vl", "bailingmoe3", "muse-glimmer",
})


def key(template: str, arch: str) -> str:
    return template.format(arch=arch)

# Block drafters (DFlash, DSpark: llama.cpp's ``dflash`` architecture, src/models/dflash.cpp and
# common/speculative.cpp's draft-dflash / draft-dspark): one drafter decode of [last token, MASK...]
DFLASH_ARCH = "dflash"
KEY_BLOCK_SIZE = "{arch}.block_size"                      # the trained block (anchor + drafts)
KEY_SAMPLE_FROM_ANCHOR = "{arch}.sample_from_anchor"      # DSpark: drafts read from the anchor row on
KEY_HAS_CONFIDENCE_HEAD = "{arch}.has_confidence_head"    # DSpark: conf_proj present
KEY_CAUSAL = "{arch}.attention.causal"                    # block-internal attention (default off)
KEY_SELECTOR_TOP_K = "{arch}.selector_top_k"              # DFlash2's selector (not run by localspec)
KEY_HC_COUNT = "{arch}.hyper_connection_count"            # DSpark on DeepSeek V4's blocks
KEY_MASK_ID = "tokenizer.ggml.mask_token_id"
T_MARKOV_W1 = "markov_w1.weight"      # DSpark's Markov head: [rank, n_vocab] (GGUF order)
T_MARKOV_W2 = "markov_w2.weight"      # [rank, n_vocab of the draft]
T_CONF_PROJ = "conf_proj.weight"      # DSpark's confidence head: [n_embd + rank, 1]
T_CONF_PROJ_B = "conf_proj.bias"
T_SELECTOR_HIDDEN = "selector_hidden.weight"   # DFlash2
# target architectures whose graph also records the output of the last layer (t_layer_inp[n_layer])
LAST_LAYER_INP_ARCHS = frozenset({"deepseek4", "mimo2", "nemotron_h"})
BLOCK_SIZE_MAX = 64     # the largest block localspec drafts (published drafters: 7 to 16)
