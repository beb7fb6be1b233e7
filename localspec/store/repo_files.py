"""Finding a catalog's file in a Hugging Face repository whose files were renamed.

A catalog entry names files (``Qwen3-4B-Q4_K_M.gguf``, ``pytorch_model.bin``) that the repository's
owner may rename, re-case (``mxfp4`` / ``MXFP4``), split into shards or re-upload in another format.
When the named file is missing, ``pull`` reads the repository's file listing and picks the file by
these rules, in order (the first rule that gives exactly one answer wins):

GGUF files (a target, or a drafter ``file``)
    1. the name itself, then each of the entry's ``alternatives``, then the same name in another
       letter case;
    2. the files with the same quantisation tag (``Q4_K_M``, ``Q8_0``, ``MXFP4``, ...; unsloth's
       dynamic ``UD-`` variant of the tag only when the plain one is absent), ``mmproj`` files
       excluded; several candidates that share the catalog name's stem are narrowed to that stem;
    3. among the candidates of one stem, a single file before a split set
       (``NAME-00001-of-0000N.gguf``), and a split set only when every shard is listed.

Checkpoint weights (a drafter ``files`` list)
    1. the name itself, each of the ``alternatives``, then another letter case;
    2. ``model.safetensors``, ``pytorch_model.bin``, the sharded ``model-0000i-of-0000N.safetensors``
       (with ``model.safetensors.index.json``), the sharded ``pytorch_model-...bin``;
    3. the only other ``.safetensors`` / ``.bin`` file at the top of the repository.

Anything else is an error that lists the candidates, so the user can name one in their own
``models.toml``. The rules are pure functions of the listing (tested without a network);
:func:`localspec.store.hub.list_files` reads the listing (``HF_ENDPOINT`` applies) or, with
``HF_HUB_OFFLINE`` set, takes it from the cached snapshot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..core.errors import LocalspecError

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(r"^(?:I?Q\d+(?:_[A-Z0-9]+)*|MXFP4(?:_MOE)?|F16|BF16|F32|TQ\d_\d)$", re.IGNORECASE)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state.bin")


@dataclass(frozen=True)
class Resolved:
    """The file(s) ``pull`` downloads instead of the catalog's, and why."""

    files: tuple[str, ...]              # GGUF: first file then further shards; checkpoint: all files
    rule: str                           # how they were chosen (said to the user)
    renamed: dict[str, str] = field(default_factory=dict)   # catalog name -> repository name


# --------------------------------------------------------------------------------------------
# GGUF names


@dataclass(frozen=True)
class GgufName:
    path: str          # as listed (may include folders)
    stem: str          # base name without .gguf and without the split suffix
    quant: str | None  # upper-case tag, e.g. Q4_K_M
    dynamic: bool      # unsloth's UD- prefix before the tag
    shard: tuple[int, int] | None   # (i, n) of a split GGUF


def parse_gguf_name(path: str) -> GgufName:
    base = PurePosixPath(path).name
    m = _SPLIT.match(base)
    if m:
        stem, shard = m.group("stem"), (int(m.group("i")), int(m.group("n")))
    else:
        stem, shard = (base[:-5] if base.lower().endswith(".gguf") else base), None
    tokens = stem.split("-")
    quant, dynamic = None, False
    for k in range(len(tokens) - 1, -1, -1):
        if _QUANT.match(tokens[k]):
            quant = tokens[k].upper()
            dynamic = k > 0 and tokens[k - 1].upper() == "UD"
            break
    return GgufName(path=path, stem=stem, quant=quant, dynamic=dynamic, shard=shard)


def _folder(path: str) -> str:
    return str(PurePosixPath(path).parent).lower()


def _group(names: list[GgufName]) -> dict[tuple[str, str, bool], list[GgufName]]:
    """Files by (folder, stem, split?): one group is one usable model file or one split set."""
    groups: dict[tuple[str, str, bool], list[GgufName]] = {}
    for n in names:
        groups.setdefault((_folder(n.path), n.stem.lower(), n.shard is not None), []).append(n)
    return groups


def _complete_split(group: list[GgufName]) -> tuple[str, ...] | None:
    totals = {g.shard[1] for g in group if g.shard}
    if len(totals) != 1:
        return None
    n = totals.pop()
    by_index = {g.shard[0]: g.path for g in group if g.shard}
    if sorted(by_index) != list(range(1, n + 1)):
        return None
    return tuple(by_index[i] for i in range(1, n + 1))


def _case_insensitive(wanted: str, listing: list[str]) -> str | None:
    hits = [f for f in listing if f.lower() == wanted.lower()]
    return hits[0] if len(hits) == 1 else None


def _candidates_error(repo: str, wanted: str, candidates: list[str], what: str) -> LocalspecError:
    shown = ", ".join(sorted(candidates)[:12]) + (" ..." if len(candidates) > 12 else "")
    return LocalspecError(
        f"{repo}: no file '{wanted}'; {what}: {shown}. Name the one you want in your models.toml "
        "(`localspec list --catalog` shows the entry; <user dir>/models.toml overrides it)"
    )


def resolve_gguf(repo: str, wanted: str, parts: list[str], listing: list[str],
                 alternatives: list[str] = ()) -> Resolved:
    """The GGUF file (and its further shards) in ``listing`` that stands for ``wanted`` (+ ``parts``)."""
    present = set(listing)
    if wanted in present and all(p in present for p in parts):
        return Resolved((wanted, *parts), "as named")
    for alt in alternatives:
        if alt in present:
            return _with_shards(repo, alt, listing, f"the catalog's alternative name '{alt}'", wanted)
    hit = _case_insensitive(wanted, listing)
    if hit is not None:
        return _with_shards(repo, hit, listing, "the same name in another letter case", wanted)

    want = parse_gguf_name(wanted)
    ggufs = [parse_gguf_name(f) for f in listing
             if f.lower().endswith(".gguf") and not PurePosixPath(f).name.lower().startswith("mmproj")]
    if want.quant is None:
        raise _candidates_error(repo, wanted, [g.path for g in ggufs],
                                "its name has no quantisation tag to match, and the repository has")
    same = [g for g in ggufs if g.quant == want.quant and g.dynamic == want.dynamic]
    rule = f"the same quantisation tag {want.quant}"
    if not same:
        same = [g for g in ggufs if g.quant == want.quant]
        rule = f"the quantisation tag {want.quant} (unsloth's dynamic UD- variant)" if not want.dynamic \
            else f"the quantisation tag {want.quant} (without UD-)"
    if not same:
        tags = sorted({g.quant for g in ggufs if g.quant})
        raise _candidates_error(repo, wanted, [g.path for g in ggufs],
                                f"no {want.quant} file either (tags there: {', '.join(tags) or 'none'}); files")
    groups = _group(same)
    stems = {key[1] for key in groups}
    if len(stems) > 1:
        mine = {key: g for key, g in groups.items() if key[1] == want.stem.lower()}
        if not mine:
            raise _candidates_error(repo, wanted, [g.path for g in same],
                                    f"several {want.quant} files match")
        groups = mine
    folders = {key[0] for key in groups}
    if len(folders) > 1:
        raise _candidates_error(repo, wanted, [g.path for g in same], f"several {want.quant} files match")
    singles = [g for key, g in groups.items() if not key[2]]
    splits = [g for key, g in groups.items() if key[2]]
    if singles:
        files = singles[0]
        if len(files) > 1:   # cannot happen for one (folder, stem) but keep the rule total
            raise _candidates_error(repo, wanted, [f.path for f in files], "several files match")
        why = rule + (" (a single file, preferred to its split shards)" if splits else "")
        return Resolved((files[0].path,), why, {wanted: files[0].path})
    shards = _complete_split(splits[0])
    if shards is None:
        raise _candidates_error(repo, wanted, [g.path for g in splits[0]],
                                "the matching split GGUF is incomplete")
    return Resolved(shards, rule + f" (a split GGUF of {len(shards)} shards)", {wanted: shards[0]})


def _with_shards(repo: str, name: str, listing: list[str], rule: str, wanted: str) -> Resolved:
    """``name`` and, when it is the first shard of a split GGUF, the rest of its set."""
    parsed = parse_gguf_name(name)
    if parsed.shard is None:
        return Resolved((name,), rule, {wanted: name})
    if parsed.shard[0] != 1:
        raise LocalspecError(f"{repo}: '{name}' is shard {parsed.shard[0]} of a split GGUF; "
                             "the catalog must name the first shard")
    key = (_folder(name), parsed.stem.lower(), True)
    group = _group([parse_gguf_name(f) for f in listing if f.lower().endswith(".gguf")]).get(key, [])
    shards = _complete_split(group)
    if shards is None:
        raise _candidates_error(repo, wanted, [g.path for g in group], "the split GGUF is incomplete")
    return Resolved(shards, rule + f" (a split GGUF of {len(shards)} shards)", {wanted: name})


# --------------------------------------------------------------------------------------------
# checkpoint files


_SHARDED = (
    (re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$"), "model.safetensors.index.json"),
    (re.compile(r"^pytorch_model-\d{5}-of-\d{5}\.bin$"), "pytorch_model.bin.index.json"),
)


def _is_weights(name: str) -> bool:
    return name.lower().endswith(_WEIGHT_SUFFIXES) and name.lower() not in _NOT_WEIGHTS


def _weights(repo: str, wanted: str, top: list[str], alternatives: list[str]) -> tuple[tuple[str, ...], str]:
    present = set(top)
    for alt in alternatives:
        if alt in present:
            return (alt,), f"the catalog's alternative name '{alt}'"
    hit = _case_insensitive(wanted, top)
    if hit is not None:
        return (hit,), "the same name in another letter case"
    for standard in ("model.safetensors", "pytorch_model.bin"):
        hit = _case_insensitive(standard, top)
        if hit is not None:
            return (hit,), f"the standard weights file {standard}"
    for pattern, index in _SHARDED:
        shards = sorted(f for f in top if pattern.match(f))
        if shards:
            n = int(shards[0].rsplit("-of-", 1)[1].split(".")[0])
            if len(shards) != n:
                raise _candidates_error(repo, wanted, shards, "the sharded weights are incomplete")
            extra = (index,) if index in present else ()
            return (*extra, *shards), f"sharded weights ({n} files)"
    others = [f for f in top if _is_weights(f)]
    if len(others) == 1:
        return (others[0],), "the only weights file in the repository"
    raise _candidates_error(repo, wanted, others or top,
                            "several weights files could stand for it" if others else "the repository has")


def resolve_checkpoint(repo: str, files: list[str], listing: list[str], alternatives: list[str] = ()) -> Resolved:
    """The files of a drafter checkpoint in ``listing`` that stand for the catalog's ``files``."""
    top = [f for f in listing if "/" not in f]
    present = set(top)
    out: list[str] = []
    renamed: dict[str, str] = {}
    rules: list[str] = []
    for f in files:
        if f in present:
            out.append(f)
            continue
        if _is_weights(f):
            got, why = _weights(repo, f, top, list(alternatives))
        else:
            hit = _case_insensitive(f, top)
            if hit is None:
                raise _candidates_error(repo, f, top, "the repository has")
            got, why = (hit,), "the same name in another letter case"
        out.extend(g for g in got if g not in out)
        renamed[f] = ", ".join(got)
        rules.append(f"{f} -> {', '.join(got)} ({why})")
    return Resolved(tuple(out), "; ".join(rules) or "as named", renamed)
