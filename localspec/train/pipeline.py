"""The whole ``localspec train`` run: check -> generate data -> features -> vocab -> train -> export.

Work files live in ``<out>.train/`` (or ``--work-dir``): ``sequences.jsonl`` (token ids, one line
per generated sequence), ``vocab.npy``, ``checkpoint.pt`` (full training state), ``best.pt`` (the
best drafter by held-out tokens per cycle), ``summary.json``. ``--resume`` continues each stage
where it stopped. The drafter GGUF is written only at the end, atomically, by the converter.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..formats import gguf_consts as K
from ..core.atomic import atomic_path, atomic_write
from ..core.errors import LocalspecError
from ..core.units import format_size
from ..formats.gguf_info import GGUFInfo, check_target, read_gguf
from .dataset import DatasetWriter, Sequence, check_free_space, load_sequences, prompt_key, write_compressed
from .prompts import load_prompts

HELD_OUT_MOD = 20   # 1 in 20 prompt groups (topics; a prompt alone where none) is held out for the estimate


@dataclass
class TrainOptions:
    target: Path
    out: Path
    prompts: Path | None = None
    data: Path | None = None          # an existing dataset (.jsonl / .jsonl.gz): no generation
    work_dir: Path | None = None
    device: str = "cpu"
    time_budget_s: float = 1800.0     # the whole run
    gen_time_s: float | None = None   # data generation limit (default: 40% of the budget)
    max_steps: int = 0
    resume: bool = False
    n_seq: int = 16
    max_new: int = 320
    draft_vocab: int = 8192
    top_k: int = 16
    ttt_steps: int = 4
    batch_tokens: int = 2048
    lr: float = 1e-3
    outtype: str = "f16"
    threads: int | None = None        # llama.cpp threads (generation, features)
    train_threads: int | None = None  # torch threads
    seed: int = 0
    save_data: Path | None = None     # also write the dataset, compressed, here
    eval_every_s: float = 180.0
    log: Callable[[str], None] = print
    progress: Callable[[dict], None] | None = None


@dataclass
class TrainSummary:
    out: Path
    sequences: int = 0
    response_tokens: int = 0
    gen_seconds: float = 0.0
    gen_tokens: int = 0
    feature_seconds: float = 0.0
    train_seconds: float = 0.0
    steps: int = 0
    best_tau: float = 0.0
    history: list = field(default_factory=list)
    drafter_bytes: int = 0
    vocab_coverage: float = 0.0


def parse_duration(text: str) -> float:
    """'90', '90s', '25m', '1.5h' -> seconds."""
    t = str(text).strip().lower()
    mult = {"s": 1, "m": 60, "h": 3600}
    try:
        if t and t[-1] in mult:
            value = float(t[:-1]) * mult[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise LocalspecError(f"not a duration: '{text}' (examples: 600, 90s, 25m, 1.5h)") from None
    if not 0 < value < float("inf"):   # nan and inf too
        raise LocalspecError(f"the duration must be a positive finite number (got '{text}')")
    return value


def check_train_target(path: Path):
    info = read_gguf(path)
    check_target(info)
    if info.arch not in K.FEATURE_ARCHS:
        raise LocalspecError(
            f"target architecture '{info.arch}' ({info.path.name}) cannot export layer features in this "
            f"llama.cpp, so no drafter can be trained or run for it; supported: {', '.join(sorted(K.FEATURE_ARCHS))}")
    return info


def _check_device(device: str) -> None:
    import torch

    if device == "cpu":
        return
    if device == "cuda" and not torch.cuda.is_available():
        raise LocalspecError("--device cuda: this torch build sees no CUDA device")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LocalspecError("--device mps: this torch build sees no MPS device")
    if device not in ("cuda", "mps"):
        raise LocalspecError(f"unknown device '{device}' (cpu, cuda or mps)")


def drafter_config(info, layers):
    from ..converters.canonical import DrafterConfig

    m = info.metadata
    arch = info.arch

    def meta(template, default=None):
        v = m.get(K.key(template, arch), default)
        if v is None:
            raise LocalspecError(f"{info.path.name}: missing {K.key(template, arch)}")
        return v

    n_head = int(meta(K.KEY_HEAD_COUNT))
    n_kv = meta(K.KEY_HEAD_COUNT_KV, n_head)
    n_kv = int(n_kv if np.ndim(n_kv) == 0 else np.asarray(n_kv).ravel()[0])
    head_dim = int(m.get(K.key(K.KEY_KEY_LENGTH, arch), info.n_embd // n_head))
    ff = meta(K.KEY_FEED_FORWARD_LENGTH)
    ff = int(ff if np.ndim(ff) == 0 else np.asarray(ff).ravel()[0])
    eps = float(m.get(K.key(K.KEY_RMS_EPS, arch), 1e-5))
    return DrafterConfig(
        hidden_size=info.n_embd, intermediate_size=ff, num_heads=n_head, num_kv_heads=n_kv, head_dim=head_dim,
        rms_eps=eps, rope_theta=float(m.get(K.key(K.KEY_ROPE_FREQ_BASE, arch), 10000.0)),
        max_position=int(info.n_ctx_train or 4096), target_hidden_size=info.n_embd, target_layers=tuple(layers),
        vocab_size=info.n_vocab, variant=K.VARIANT_EAGLE31, fc_norm=True, fc_norm_eps=eps, norm_output=True,
        source_layout="localspec-train", source=info.path.name)


def feature_tag(info, layers, top_k: int, max_len: int) -> str:
    """Identifies how features were made: target file, layers, top-k and truncation."""
    import hashlib

    return hashlib.sha1(json.dumps([str(info.path.resolve()), info.size_bytes, list(layers), top_k,
                                    max_len]).encode()).hexdigest()


def sequence_id(tokens, n_prompt: int) -> str:
    """Identifies one sequence's features: its (truncated) token ids and prompt length."""
    import hashlib

    return hashlib.sha1(np.asarray(tokens, dtype=np.int32).tobytes() + int(n_prompt).to_bytes(4, "little")).hexdigest()


def save_feature_cache(path: Path, tag: str, feats) -> None:
    """Features of a run in one file, so that --resume skips the prefill (written atomically)."""
    try:
        check_free_space(path.parent, sum(f.feats.nbytes for f in feats) + (64 << 20))
    except LocalspecError:
        return  # a cache only: without room, a resumed run recomputes the features
    lens = np.array([len(f.tokens) for f in feats], dtype=np.int64)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:   # a file object: numpy adds no suffix
        np.savez(fh, tag=np.array(tag), lens=lens, n_prompt=np.array([f.n_prompt for f in feats]),
                 tokens=np.concatenate([f.tokens for f in feats]), feats=np.concatenate([f.feats for f in feats]),
                 top_ids=np.concatenate([f.top_ids for f in feats]),
                 top_logits=np.concatenate([f.top_logits for f in feats]))


def load_feature_cache(path: Path, tag: str) -> dict:
    """The cached features made the same way (``tag``), by :func:`sequence_id`; {} when none."""
    from .features import SeqFeatures

    if not path.is_file():
        return {}
    try:
        z = np.load(path)
        if str(z["tag"]) != tag:
            return {}
        arrays = {k: z[k] for k in ("tokens", "feats", "top_ids", "top_logits")}
        ends = np.cumsum(z["lens"])
        starts = ends - z["lens"]
        out = {}
        for a, b, n in zip(starts, ends, z["n_prompt"]):
            f = SeqFeatures(arrays["tokens"][a:b], int(n), arrays["feats"][a:b], arrays["top_ids"][a:b],
                            arrays["top_logits"][a:b])
            out[sequence_id(f.tokens, f.n_prompt)] = f
        return out
    except (OSError, ValueError, KeyError):
        return {}


def is_held_out(seq) -> bool:
    """Whole groups (topics) are held out, so the estimate sees topics training never saw."""
    import hashlib

    if seq.group:
        return int(hashlib.sha1(seq.group.encode()).hexdigest()[:8], 16) % HELD_OUT_MOD == 0
    return int(seq.key[:8], 16) % HELD_OUT_MOD == 0


@dataclass
class _Inputs:
    """What the run's checks produced, before anything is written."""
    info: GGUFInfo               # the target
    out: Path
    work: Path
    prompts: list | None
    data_seqs: list[Sequence] | None


@dataclass
class _Data:
    """Stages 1-2: the split dataset and the target's features for it."""
    train_set: list[Sequence]
    held: list[Sequence]
    layers: list[int]
    train_feats: list
    held_feats: list
    emb: np.ndarray


def run(opts: TrainOptions) -> TrainSummary:
    t_start = time.perf_counter()
    inputs = _check_inputs(opts)
    from ..llama.process import set_verbose
    from ..llama import llama_ext

    set_verbose(False)
    llama_ext.check_available()
    summary = TrainSummary(out=inputs.out)
    data = _data_and_features(opts, inputs, summary, t_start)
    ids, index = _draft_vocabulary(opts, inputs, data, summary)
    cfg, state = _train(opts, inputs, data, ids, index, summary, t_start)
    _export(opts, inputs, cfg, state, summary)
    return summary


def _check_inputs(opts: TrainOptions) -> _Inputs:
    """Every check that needs no model loaded; input files are read before anything is written."""
    target = Path(opts.target).expanduser()
    out = Path(opts.out).expanduser()
    info = check_train_target(target)
    if out.suffix != ".gguf":
        raise LocalspecError(f"{out}: the output must be a .gguf path")
    if out.exists() and out.is_dir():
        raise LocalspecError(f"{out} is a directory")
    if out.exists() and out.resolve() == target.resolve():
        raise LocalspecError(f"{out} is the target model; refusing to overwrite it")
    if not out.parent.is_dir():
        raise LocalspecError(f"{out.parent}: no such directory")
    prompts = load_prompts(opts.prompts) if opts.data is None else None
    data_seqs = load_sequences(opts.data) if opts.data is not None else None
    if data_seqs is not None and not data_seqs:
        raise LocalspecError(f"{opts.data}: the dataset has no sequences")
    if data_seqs is not None:   # token ids go to llama.cpp as they are
        top = max(max(s.prompt + s.response, default=0) for s in data_seqs)
        if top >= info.n_vocab:
            raise LocalspecError(f"{opts.data}: token id {top} is outside {target.name}'s vocabulary "
                                 f"(0..{info.n_vocab - 1})")
    _check_device(opts.device)
    work = Path(opts.work_dir).expanduser() if opts.work_dir else out.with_name(out.stem + ".train")
    check_free_space(out.parent)
    if work.exists() and any(work.iterdir()) and not opts.resume:
        raise LocalspecError(f"{work} holds an earlier run: pass --resume to continue it, or remove it")
    work.mkdir(parents=True, exist_ok=True)
    check_free_space(work)
    return _Inputs(info, out, work, prompts, data_seqs)


def _data_and_features(opts: TrainOptions, inputs: _Inputs, summary: TrainSummary, t_start: float) -> _Data:
    """Stages 1 (data: given or generated) and 2 (features), with the target loaded once for both."""
    from ..llama.llama_model import Model
    from .features import token_embeddings

    info, log = inputs.info, opts.log
    model = Model(info.path)
    try:
        if inputs.data_seqs is not None:
            seqs = inputs.data_seqs
            log(f"data: {len(seqs)} sequences from {opts.data}")
        else:
            seqs = _generate(opts, info, model, inputs.prompts, inputs.work, summary, t_start)
        if opts.save_data:
            write_compressed(seqs, Path(opts.save_data))
            log(f"dataset written to {opts.save_data}")
        train_set, held = _split(seqs, summary, log)
        layers, feats = _features(opts, info, model, train_set + held, inputs.work, summary)
        emb = token_embeddings(info.path)
    finally:
        model.close()
    return _Data(train_set, held, layers, feats[:len(train_set)], feats[len(train_set):], emb)


def _split(seqs: list[Sequence], summary: TrainSummary, log: Callable[[str], None]):
    """(training set, held-out set) of the sequences with a response."""
    seqs = [s for s in seqs if s.response]
    if len(seqs) < 2:
        raise LocalspecError("too little data to train on (fewer than 2 responses)")
    summary.sequences = len(seqs)
    summary.response_tokens = sum(len(s.response) for s in seqs)
    held = [s for s in seqs if is_held_out(s)]
    train_set = [s for s in seqs if not is_held_out(s)]
    if not held or not train_set:
        held, train_set = seqs[:max(1, len(seqs) // HELD_OUT_MOD)], seqs[max(1, len(seqs) // HELD_OUT_MOD):]
    log(f"data: {len(train_set)} training / {len(held)} held-out sequences, "
        f"{summary.response_tokens} response tokens")
    return train_set, held


def _features(opts: TrainOptions, info, model, seqs: list[Sequence], work: Path, summary: TrainSummary):
    """(layers, features of every sequence in order): from the work directory's cache on --resume,
    the rest prefilled."""
    from .features import default_layers, extract_all

    layers = default_layers(info.n_layer)
    t0 = time.perf_counter()
    max_len = 1024
    pairs = [(s.tokens[:max_len], len(s.prompt)) for s in seqs]
    ids = [sequence_id(t, n) for t, n in pairs]
    cache = work / "features.npz"
    tag = feature_tag(info, layers, opts.top_k, max_len)
    cached = load_feature_cache(cache, tag) if opts.resume else {}
    todo = [i for i, k in enumerate(ids) if k not in cached]
    if todo:
        opts.log(f"features: {len(todo)} sequences to prefill ({len(ids) - len(todo)} cached)")
        fresh = extract_all(model, layers, [pairs[i] for i in todo], top_k=opts.top_k, max_len=max_len,
                            n_threads=opts.threads,
                            progress=(lambda i, n: opts.progress({"event": "features", "done": i, "total": n}))
                            if opts.progress else None)
        cached.update(zip((ids[i] for i in todo), fresh))
    feats = [cached[k] for k in ids]
    if todo:
        save_feature_cache(cache, tag, feats)
    summary.feature_seconds = time.perf_counter() - t0
    opts.log(f"features: {sum(len(f.tokens) for f in feats)} positions in {summary.feature_seconds:.0f}s")
    return layers, feats


def _draft_vocabulary(opts: TrainOptions, inputs: _Inputs, data: _Data, summary: TrainSummary):
    """Stage 3: (draft vocabulary ids, target id -> draft index), kept in the work directory."""
    from .vocab import choose_draft_vocab, coverage, mappings

    n_vocab = inputs.info.n_vocab
    vocab_path = inputs.work / "vocab.npy"
    if opts.resume and vocab_path.is_file():
        ids = np.load(vocab_path)
    else:
        ids = choose_draft_vocab([s.response for s in data.train_set], n_vocab, opts.draft_vocab)
        with atomic_path(vocab_path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, ids)
    _, _, index = mappings(ids, n_vocab)
    summary.vocab_coverage = coverage(ids, [s.response for s in data.held], n_vocab)
    opts.log(f"draft vocabulary: {len(ids)} tokens, held-out coverage {summary.vocab_coverage:.1%}")
    return ids, index


def _train(opts: TrainOptions, inputs: _Inputs, data: _Data, ids, index, summary: TrainSummary, t_start: float):
    """Stage 4: (drafter config, final training state), within what is left of the time budget."""
    import torch

    from .trainer import TrainConfig, new_drafter, train

    cfg = drafter_config(inputs.info, data.layers)
    ref = new_drafter(cfg, ids, data.emb, opts.seed)
    spent = time.perf_counter() - t_start
    budget = max(10.0, opts.time_budget_s - spent - 20.0)
    tcfg = TrainConfig(ttt_steps=opts.ttt_steps, lr=opts.lr, batch_tokens=opts.batch_tokens, time_budget_s=budget,
                       max_steps=opts.max_steps, seed=opts.seed, threads=opts.train_threads or 0,
                       eval_every_s=opts.eval_every_s)
    resume_state = None
    ckpt = inputs.work / "checkpoint.pt"
    if opts.resume and ckpt.is_file():
        resume_state = torch.load(ckpt, weights_only=False)
        tcfg.time_budget_s = max(budget, resume_state["state"]["elapsed"] + budget)
        opts.log(f"resuming training at step {resume_state['state']['step']}")
    opts.log(f"training: up to {budget:.0f}s" + (f" / {opts.max_steps} steps" if opts.max_steps else ""))
    t0 = time.perf_counter()
    state = train(ref, data.emb, data.train_feats, data.held_feats, index, tcfg, inputs.work,
                  resume_state=resume_state, report=opts.progress, device=opts.device)
    summary.train_seconds = time.perf_counter() - t0
    summary.steps = state.step
    summary.best_tau = state.best_tau
    summary.history = state.history
    return cfg, state


def _export(opts: TrainOptions, inputs: _Inputs, cfg, state, summary: TrainSummary) -> None:
    """Stage 5: the best drafter as GGUF (atomically), and the run's summary in the work directory."""
    import torch

    from .export import export_gguf

    best = torch.load(inputs.work / "best.pt", weights_only=False)
    conv = export_gguf(best, cfg, inputs.info.path, inputs.out, inputs.work, outtype=opts.outtype)
    summary.drafter_bytes = conv.size_bytes
    atomic_write(inputs.work / "summary.json", json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                                           for k, v in vars(summary).items()}, indent=1))
    opts.log(f"drafter: {inputs.out} ({format_size(conv.size_bytes)}, held-out tokens/cycle {state.best_tau:.2f})")


def prompt_token_ids(info, model, prompts):
    """Each prompt rendered with the target's chat template (plain text without one) as token ids."""
    from ..formats.chat_format import ChatFormatter

    formatter = ChatFormatter(
        info.chat_template,
        bos_token=model.piece(model.bos).decode("utf-8", "replace") if model.bos >= 0 else "",
        eos_token=model.piece(model.eos).decode("utf-8", "replace") if model.eos >= 0 else "")
    out = []
    for p in prompts:
        if info.chat_template:
            text = formatter.render(p.messages, add_generation_prompt=True)
            toks = model.tokenize(text, add_special=True, parse_special=True)
            if len(toks) >= 2 and toks[0] == toks[1] == model.bos:
                toks = toks[1:]
        else:
            toks = model.tokenize("\n".join(m["content"] for m in p.messages), add_special=True, parse_special=False)
        out.append(toks)
    return out


def _generate(opts: TrainOptions, info, model, prompts, work: Path, summary: TrainSummary, t_start: float):
    from .datagen import GenRequest, generate_batched

    requests: list[GenRequest] = []
    category: dict[str, str] = {}
    group: dict[str, str] = {}
    seen = set()
    for p, toks in zip(prompts, prompt_token_ids(info, model, prompts)):
        key = prompt_key(toks)
        if key in seen:
            continue
        seen.add(key)
        category[key] = p.category
        group[key] = p.group
        requests.append(GenRequest(key, toks))
    writer = DatasetWriter(work / "sequences.jsonl", resume=opts.resume)
    todo = [r for r in requests if r.key not in writer.keys]
    rng = random.Random(opts.seed)
    rng.shuffle(todo)
    limit = opts.gen_time_s if opts.gen_time_s is not None else 0.4 * opts.time_budget_s
    opts.log(f"generating: {len(todo)} prompts to answer ({len(requests) - len(todo)} done), "
             f"{opts.n_seq} sequences per batch, up to {limit:.0f}s")
    t0 = time.perf_counter()
    n_tok = 0
    try:
        for r in generate_batched(model, todo, n_seq=opts.n_seq, max_new=opts.max_new, n_ctx_seq=1024,
                                  n_threads=opts.threads, should_stop=lambda: time.perf_counter() - t0 > limit):
            if r.finish == "skipped":
                continue
            writer.add(Sequence(r.key, category.get(r.key, ""), r.prompt, r.response, r.finish, group.get(r.key, "")))
            n_tok += len(r.response)
            if opts.progress:
                opts.progress({"event": "gen", "done": len(writer.sequences), "total": len(requests),
                               "tokens": n_tok, "tok_s": n_tok / max(time.perf_counter() - t0, 1e-9)})
    finally:
        writer.close()
    summary.gen_seconds = time.perf_counter() - t0
    summary.gen_tokens = n_tok
    for s in writer.sequences:  # sequences of an earlier run (or an older prompt file) learn their group
        if not s.group:
            s.group = group.get(s.key, "")
    if n_tok:
        opts.log(f"generated {n_tok} tokens in {summary.gen_seconds:.0f}s ({n_tok / summary.gen_seconds:.0f} tok/s)")
    return writer.sequences
