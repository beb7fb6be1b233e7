"""The prompts ``/api`` makes itself with the model's template and tokenizer, where Ollama's
semantics need them: a last assistant message continued (prefill), an earlier answer's
``context`` (token ids) put before the prompt, and fill-in-the-middle (``suffix``) with the
GGUF's FIM tokens, as llama.cpp's infill lays them out (prefix, suffix, middle)."""

from __future__ import annotations

from typing import Optional, Sequence

from ...core.errors import LocalspecError
from ...runtime.engine import Engine
from ..errors import bad_request


def rendered(engine: Engine, prompt, param: str) -> str:
    """The text the engine would tokenize for ``prompt``: messages rendered with the template and its
    generation prompt (as :meth:`Engine.prompt_tokens` does), text as it is."""
    if isinstance(prompt, str):
        return prompt
    try:
        return engine.formatter.render(prompt, add_generation_prompt=True)
    except LocalspecError as exc:
        raise bad_request(str(exc), param=param) from None


def context_text(engine: Engine, context: Sequence[int]) -> str:
    """An earlier answer's ``context`` as text (control tokens written out, so that the prompt's
    tokenizer gives them back), to go before the new prompt, as Ollama does."""
    n_vocab = engine.model.n_vocab
    if len(context) >= engine.n_ctx:
        raise bad_request(f"context holds {len(context)} tokens; this model is served with a context of "
                          f"{engine.n_ctx}.", param="context")
    bad = next((i for i, t in enumerate(context) if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"context.{bad} ({context[bad]}) is not a token id of this model (0 to {n_vocab - 1}).",
                          param=f"context.{bad}")
    return engine.model.detokenize(context, special=True)


def fim_text(engine: Engine, model: str, prefix: str, suffix: str, system: Optional[str]) -> str:
    """``prefix`` and ``suffix`` around the FIM tokens: FIM_PRE prefix FIM_SUF suffix FIM_MID; the
    model then writes the middle. A 400 when the GGUF declares no FIM tokens."""
    if system:
        raise bad_request("system cannot be combined with suffix: a fill-in-the-middle prompt is the model's "
                          "FIM tokens around the code, with no chat template.", param="system")
    tokens = engine.model.fim_tokens()
    if tokens is None:
        raise bad_request(f"suffix (fill-in-the-middle) needs the model's FIM tokens (llama.cpp's FIM_PRE, "
                          f"FIM_SUF and FIM_MID), and \"{model}\" has none in its GGUF.", param="suffix")
    texts = []
    for token in tokens:
        text = engine.model.special_piece(token).decode("utf-8", "replace")
        if engine.model.tokenize(text, add_special=False, parse_special=True) != [token]:
            raise bad_request(f"suffix (fill-in-the-middle): \"{model}\"'s FIM token {token} ({text!r}) cannot be "
                              "written in a prompt (its text does not tokenize back to it).", param="suffix")
        texts.append(text)
    pre, suf, mid = texts
    return pre + prefix + suf + suffix + mid
