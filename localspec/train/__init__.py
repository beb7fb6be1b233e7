"""``localspec train``: self-distillation of an EAGLE-3.1 drafter for a target GGUF.

Modules, one job each: :mod:`.prompts` (prompt sets), :mod:`.datagen` (batched greedy generation
through llama.cpp), :mod:`.dataset` (token-id storage), :mod:`.features` (target features and
top-k logits by batched prefill), :mod:`.vocab` (draft vocabulary), :mod:`.trainer` (training-time
test unroll, checkpoints), :mod:`.export` (checkpoint directory -> converter -> GGUF),
:mod:`.pipeline` (the whole run). torch is imported only here and in the converters.
"""
