"""Prompt sets for data generation: the project's default set or a user's file.

A prompt file is JSONL, one object per line with either ``"prompt"`` (one user turn, optional
``"system"``) or ``"messages"`` (a chat: ``[{"role", "content"}, ...]`` ending with a user turn),
an optional ``"category"`` and an optional ``"group"`` (prompts on one topic: the held-out estimate
keeps whole groups out of training, so near-duplicates do not inflate it); or plain text
(``.txt``), one prompt per line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import LocalspecError
from ..core.paths import package_data

DEFAULT_PROMPTS = "train_prompts.jsonl"


@dataclass
class TrainPrompt:
    category: str
    messages: list[dict]
    group: str = ""   # prompts on one topic (held out together); "" for none


def default_prompts_path() -> Path:
    return package_data(DEFAULT_PROMPTS)


def load_prompts(path: str | Path | None = None) -> list[TrainPrompt]:
    p = Path(path) if path is not None else default_prompts_path()
    if not p.is_file():
        raise LocalspecError(f"{p}: no such prompts file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalspecError(f"{p}: cannot read ({exc})") from None
    out: list[TrainPrompt] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix == ".txt":
            out.append(TrainPrompt("default", [{"role": "user", "content": line.strip()}]))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LocalspecError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise LocalspecError(f"{p}:{lineno}: expected a JSON object")
        category = str(obj.get("category", "default"))
        group = str(obj.get("group", ""))
        if isinstance(obj.get("messages"), list) and obj["messages"]:
            msgs = obj["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in msgs):
                raise LocalspecError(f'{p}:{lineno}: "messages" must be a list of {{"role", "content"}} objects')
            out.append(TrainPrompt(category, [{"role": m["role"], "content": m["content"]} for m in msgs], group))
        elif isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
            msgs = [{"role": "system", "content": obj["system"]}] if isinstance(obj.get("system"), str) else []
            out.append(TrainPrompt(category, msgs + [{"role": "user", "content": obj["prompt"]}], group))
        else:
            raise LocalspecError(f'{p}:{lineno}: expected a non-empty "prompt" string or a "messages" list')
    if not out:
        raise LocalspecError(f"{p}: the prompt file has no prompts")
    return out
