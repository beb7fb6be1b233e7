"""localspec against llama.cpp's own speculators, side by side on the same prompts and token ids.

    python bench/peer_llamacpp.py -n 128 --threads 2 [--prompts bench/chat.jsonl ...] \
        [--native plain,ngram-mod,ngram-map-k,ngram-simple,draft-eagle3] [--modes plain,auto] \
        [--limit N] [--repeats R] [--busy] [--json results.json]

Without ``--prompts`` it runs the four sets of issue 17: ``bench/chat.jsonl``, ``copy.jsonl``,
``coding.jsonl`` and ``repetitive.jsonl``. It prints one table per set (tok/s, ratio to the
native plain decoding over all tokens of the set, the per-prompt median ratio, acceptance, and
whether greedy output equals localspec's plain decoding: ``yes``, or ``gapX`` with X the widest
top-1 minus top-2 logit gap of plain decoding where a run left it, a near-tie when tiny: batched
kernels round differently) and, per localspec mode, its rate over
the best native n-gram speculator of each set (``vs best n-gram``) and the lowest of them.

The native side is llama.cpp's ``llama-speculative-simple``, built once with cmake from the
``vendor/llama.cpp`` of the pinned llama-cpp-python sdist (the same llama.cpp localspec runs on)
into a cache directory (``--cache``, default ``~/.cache/localspec/peer``; 10-20 minutes on 2
cores). For every prompt the native types and localspec's modes run back to back (interleaved, so
a change in machine load hits all of them alike), on the same target GGUF (the model's, default:
the embedded Q4_0 SmolLM2), the same rendered chat prompt (the native tool parses special tokens;
the prompt token counts are checked to agree) and the same thread count, greedy. The native tool
reads the weights into memory (``--load-mode none``, its fastest load mode here: +3% over mapping
the file at one thread), as localspec does (into huge pages); ``--native-args ''`` runs it with its
default mapping.

Rates compare like with like: the native tool times the decode steps that produce its N tokens
(the first one included: its prompt pass stops before the last prompt token); localspec's
generation clock starts after the prefill that already chose the first token, so its rate here is
(N - 1) / generation seconds. Ratios are to the native plain decoding (the native tool needs some
speculator: ``ngram-mod`` with a lookup length of 1024 never matches, so it decodes plainly).
This is for people who measure; CI does not run it. Measure on an idle machine (``uptime``).

Same length: the native tool checks ``-n`` only after each cycle, so a speculating type decodes
up to 63 tokens more than asked, the most repetitive and cheapest part of a looping text. So
localspec's modes generate as many tokens as the longest native run of that prompt decoded, and a
localspec rate set against a native type is cut at that type's token count on each prompt (at the
end of the cycle that reached it): both cover the same text at the same context lengths (a longer
context makes every step dearer; the tok/s column is over each run's whole length, the ratios are
cut). ``--exact-n``: localspec generates exactly ``-n`` and is not cut.
The JSON (``--json``) has every prompt's tokens, seconds and acceptance per type and mode.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from statistics import median

from localspec.runtime.bench import first_divergence, load_prompts
from under_load import busy_core
from localspec.formats.chat_format import Message
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.core.events import CycleEvent, DoneEvent
from localspec.store.models import resolve
from localspec.speculation.policy import PolicyConfig

TOOL = "llama-speculative-simple"
SETS = ("chat", "copy", "coding", "repetitive")   # the default prompt sets, bench/NAME.jsonl
NGRAM = ("ngram-mod", "ngram-map-k", "ngram-simple")
# --spec-type arguments per native type; "plain" never drafts (no 1024-token n-gram ever matches)
NATIVE = {
    "plain": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1024"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    # ngram-mod as a lookup chain of 4: drafts from a 4-token match, 1 to 4 of them (its defaults,
    # a 24-token match and 48 drafts at least, draft nothing on chat-length answers)
    "ngram-mod-chain": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1",
                        "--spec-ngram-mod-n-max", "4"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "draft-eagle3": ["--spec-type", "draft-eagle3"],   # plus -md DRAFTER
}
# every native run reads the weights into memory (llama.cpp's default maps the file): its fastest
# load mode on this CPU, as localspec reads them (into huge pages, localspec.llama.weights_memory)
NATIVE_ARGS = "--load-mode none"
MODES = {  # localspec modes: generation config overrides
    "plain": dict(spec=False),
    "auto": dict(spec=True, policy=PolicyConfig("auto")),
    "chain": dict(spec=True, policy=PolicyConfig("auto", tree="off")),
    "tree": dict(spec=True, policy=PolicyConfig("auto", tree="on")),   # EAGLE trees wherever it drafts
    "lookup": dict(spec=True, policy=PolicyConfig("auto", source="lookup")),
    # auto with every verify under 64 rows: on a CPU, greedy output equal to plain decoding bit for bit
    "exact": dict(spec=True, policy=PolicyConfig("auto", lookup_max=62)),
}
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ENCODED = re.compile(r"encoded\s+(\d+) tokens")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def build_tool(cache: Path, tool: str = TOOL) -> Path:
    """A native tool (``llama-speculative-simple``, or ``llama-server`` for bench/serve_load.py)
    for the installed llama-cpp-python's vendored llama.cpp, built once."""
    version = importlib.metadata.version("llama-cpp-python")
    root = cache / f"llama.cpp-{version}"
    binary = root / "build" / "bin" / tool
    if binary.is_file():
        return binary
    src = root / "src"
    if not (src / "CMakeLists.txt").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            print(f"downloading the llama-cpp-python {version} sdist ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                            f"llama-cpp-python=={version}", "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            prefix = f"{sdist.name[:-len('.tar.gz')]}/vendor/llama.cpp/"
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(src, members=[m for m in members if m.name], filter="data")
    print(f"building {tool} into {root / 'build'} (10-20 minutes on 2 cores) ...", file=sys.stderr)
    # the same CMAKE_ARGS as llama-cpp-python's own build (docs/install.md: e.g. AMX off where it faults)
    subprocess.run(["cmake", "-S", str(src), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    f"-DLLAMA_BUILD_SERVER={'ON' if tool == 'llama-server' else 'OFF'}",
                    *shlex.split(os.environ.get("CMAKE_ARGS", ""))], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(root / "build"), "--target", tool, "-j"], check=True)
    return binary


def run_native(tool: Path, kind: str, target: Path, drafter: Path | None, text: str, n: int,
               threads: int | None, n_ctx: int, extra: list[str] = ()) -> dict:
    """One native run; ``threads`` None: llama.cpp's own default (every physical core)."""
    cmd = [str(tool), "-m", str(target), "-p", text, "-n", str(n), "--temp", "0", "--seed", "1",
           "-c", str(n_ctx), *NATIVE[kind], *extra]
    if threads is not None:
        cmd += ["-t", str(threads), "-tb", str(threads)]
    if kind == "draft-eagle3":
        if drafter is None:
            raise SystemExit("draft-eagle3 needs a drafter")
        cmd += ["-md", str(drafter)]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = proc.stdout + proc.stderr
    dec, enc = DECODED.search(log), ENCODED.search(log)
    if proc.returncode != 0 or not dec or not enc:
        tail = "\n".join(log.strip().splitlines()[-5:])
        raise SystemExit(f"{TOOL} --spec-type {kind} failed (exit {proc.returncode}):\n{tail}")
    drafted, accepted = DRAFTED.search(log), ACCEPTED.search(log)
    return {"prompt_tokens": int(enc.group(1)), "tokens": int(dec.group(1)), "seconds": float(dec.group(2)),
            "drafted": int(drafted.group(1)) if drafted else 0, "accepted": int(accepted.group(1)) if accepted else 0}


def run_localspec(engine: Engine, messages: list[Message], mode: str, n: int, margins: bool = False) -> dict:
    """One localspec run; ``margins``: record plain decoding's top-2 logit gaps (untimed use only)."""
    engine.clear_cache()  # every run prefills the whole prompt, as the native tool does
    config = GenerationConfig(max_tokens=n, record_margins=margins, **MODES[mode])
    timeline = []  # (tokens after the first, generation seconds) after every cycle
    for event in engine.generate(messages, config):
        if isinstance(event, CycleEvent):
            timeline.append((event.stats.generated_tokens - 1, event.stats.generation_seconds))
        elif isinstance(event, DoneEvent):
            done = event
    s = done.stats
    return {"prompt_tokens": s.prompt_tokens, "tokens": max(s.generated_tokens - 1, 0),
            "seconds": s.generation_seconds, "drafted": s.drafted, "accepted": s.accepted,
            "token_ids": list(done.tokens), "timeline": timeline, "done": done}


def upto(run: dict, n: int) -> tuple[int, float]:
    """A localspec run cut at ``n`` tokens: (tokens, seconds) at the end of the cycle that reached n
    (the whole run when it stopped before)."""
    for tokens, seconds in run["timeline"]:
        if tokens >= n:
            return tokens, seconds
    return run["tokens"], run["seconds"]


def rate(runs: list[dict], lengths: list[int] | None = None) -> float:
    """tok/s over a set's runs; a localspec mode's cut at the given per-prompt lengths (a native
    type's token counts), so both rates cover the same stretch of text, the same context lengths."""
    # a native run's N tokens are N decodes; localspec's prefill chose its first token, so N - 1
    cut = [upto(r, n - 1) for r, n in zip(runs, lengths)] if lengths else [(r["tokens"], r["seconds"]) for r in runs]
    return sum(t for t, _ in cut) / max(sum(s for _, s in cut), 1e-9)


def fastest(a: dict | None, b: dict) -> dict:
    return b if a is None or b["seconds"] < a["seconds"] else a


def bench_set(path: Path, engine: Engine, tool: Path | None, native: list[str], modes: list[str], n: int,
              threads: int | None, target: Path, drafter: Path | None, limit: int | None = None,
              exact_n: bool = False, native_args: list[str] = (), repeats: int = 1) -> dict:
    """Every prompt: ``repeats`` rounds of all native types and localspec modes back to back, the
    fastest run of each counting (greedy runs repeat the same tokens: a slow spell of a shared
    machine drops out). Each localspec repeat starts from the acceptance statistics the engine had
    before the prompt, so a repeat learns nothing from the prompt's own earlier run."""
    runs: dict[str, list[dict]] = {f"native:{k}": [] for k in native} | {m: [] for m in modes}
    prompts = load_prompts(path)[:limit]
    for bp in prompts:
        messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
        text = engine.formatter.render(messages, add_generation_prompt=True)
        n_prompt = len(engine.prompt_tokens(messages))
        best: dict[str, dict | None] = dict.fromkeys(runs)
        learned = copy.deepcopy(engine.learned)
        for _ in range(repeats):
            for kind in native:
                r = run_native(tool, kind, target, drafter, text, n, threads, engine.n_ctx, native_args)
                if r["prompt_tokens"] != n_prompt:
                    raise SystemExit(f"{path}: prompt token counts differ (native {r['prompt_tokens']}, "
                                     f"localspec {n_prompt}) for {bp.prompt[:40]!r}")
                best[f"native:{kind}"] = fastest(best[f"native:{kind}"], r)
            plain_done = None
            n_local = n if exact_n else max([n] + [best[f"native:{k}"]["tokens"] + 1 for k in native])
            for mode in modes:
                engine.learned = copy.deepcopy(learned)
                r = run_localspec(engine, messages, mode, min(n_local, engine.n_ctx - n_prompt - 1))
                done = r.pop("done")
                if mode == "plain":
                    plain_done = done
                elif plain_done is not None:   # where it differs: plain decoding's logit gap there
                    div = first_divergence(plain_done, done.tokens)
                    if div is not None and not plain_done.margins:
                        # plain again, untimed, for its logit margins (the timed run skips them:
                        # sorting 49k logits a token cost the next decodes a few % in cache misses)
                        plain_done = run_localspec(engine, messages, "plain", len(plain_done.tokens),
                                                   margins=True)["done"]
                        div = first_divergence(plain_done, done.tokens)
                    r["greedy_identical"] = div is None
                    r["divergence"] = None if div is None else vars(div)
                best[mode] = fastest(best[mode], r)
                if r.get("divergence") and not best[mode].get("divergence"):   # any repeat's counts
                    best[mode] |= {"greedy_identical": False, "divergence": r["divergence"]}
        for name, r in best.items():
            runs[name].append(r)
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return summarize(runs, modes, [bp.prompt for bp in prompts], exact_n)


def summarize(runs: dict[str, list[dict]], modes: list[str], prompts: list[str], exact_n: bool) -> dict:
    lengths = {name: [r["tokens"] for r in rs] for name, rs in runs.items() if name.startswith("native:")}
    base_name = "native:plain" if "native:plain" in runs else None
    # a localspec mode's rate against a native type is over that type's token counts per prompt
    # (unless --exact-n: then every localspec run is exactly -n long)
    def rate_vs(name: str, other: str | None) -> float:
        cut = None if (exact_n or name in lengths or other is None) else lengths[other]
        return rate(runs[name], cut)
    base = rate(runs[base_name]) if base_name else rate(runs["plain"])
    out: dict = {}
    for name, rs in runs.items():
        drafted = sum(r["drafted"] for r in rs)
        row = {"tokens_per_second": round(rate(rs), 2), "ratio": round(rate_vs(name, base_name) / base, 4),
               "acceptance_rate": round(sum(r["accepted"] for r in rs) / drafted, 4) if drafted else None}
        if base_name:
            row["median_prompt_ratio"] = round(median(
                rate([r], None if name in lengths or exact_n else [b["tokens"]]) / rate([b])
                for r, b in zip(rs, runs[base_name])), 4)
        if all("greedy_identical" in r for r in rs):
            row["greedy_identical"] = all(r["greedy_identical"] for r in rs)
            # the widest logit gap of plain decoding where a run left it (a near-tie: batch arithmetic)
            gaps = [r["divergence"]["plain_margin"] for r in rs if r["divergence"]]
            row["divergence_margin_max"] = max(gaps) if gaps else None
        out[name] = row
    ngrams = [f"native:{k}" for k in NGRAM if f"native:{k}" in runs]
    best = max(ngrams, key=lambda k: rate(runs[k]), default=None)
    for mode in modes:
        if best:
            out[mode]["vs_best_ngram"] = round(rate_vs(mode, best) / rate(runs[best]), 4)
    out["per_prompt"] = [
        {"prompt": prompt[:60]} | {name: {k: rs[i][k] for k in ("tokens", "seconds", "drafted", "accepted", "divergence")
                                          if k in rs[i]} for name, rs in runs.items()}
        for i, prompt in enumerate(prompts)]
    return out


def print_tables(results: dict, names: list[str], modes: list[str]) -> None:
    for path, res in results.items():
        print(f"\n{Path(path).name}")
        print(f"  {'':<20}{'tok/s':>8}{'ratio':>8}{'median':>8}{'accept':>8}{'greedy=':>9}{'vs best n-gram':>16}")
        for n in names:
            r = res[n]
            acc = f"{r['acceptance_rate']:.2f}" if r["acceptance_rate"] is not None else "-"
            same = {True: "yes", False: f"gap{r.get('divergence_margin_max')}"}.get(r.get("greedy_identical"), "")
            vs = f"{r['vs_best_ngram']:.2f}x" if "vs_best_ngram" in r else ""
            print(f"  {n:<20}{r['tokens_per_second']:>8.1f}{r['ratio']:>7.2f}x{r.get('median_prompt_ratio', r['ratio']):>7.2f}x"
                  f"{acc:>8}{same:>9}{vs:>16}")
    for mode in modes:
        vs = {Path(p).stem: res[mode]["vs_best_ngram"] for p, res in results.items() if "vs_best_ngram" in res[mode]}
        if vs:
            print(f"\n{mode} vs the best native n-gram speculator: "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in vs.items()) + f"; lowest {min(vs.values()):.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", action="append", type=Path,
                    help="a bench JSONL file (repeatable; default: bench/{chat,copy,coding,repetitive}.jsonl)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts of each set")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds per prompt, the fastest run of each type and mode counting (a shared machine's slow spells drop out)")
    ap.add_argument("--exact-n", action="store_true",
                    help="localspec generates exactly -n tokens (default: as many as the longest native run decoded)")
    ap.add_argument("--model", default=None, help="localspec model name or target .gguf (default: embedded)")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--threads", default="2",
                    help="threads for both sides, or 'default': each side's own choice (llama.cpp: every "
                         "physical core; localspec: adaptive, fewer while other processes take cores)")
    ap.add_argument("--busy", action="store_true",
                    help="keep one core busy (a shell loop pinned to it) for the whole run: the machine under load")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--native", default="plain,ngram-mod,ngram-map-k,ngram-simple,draft-eagle3")
    ap.add_argument("--modes", default="plain,auto")
    ap.add_argument("--native-args", default=NATIVE_ARGS,
                    help="arguments for every native run (default: '--load-mode none', llama.cpp's "
                         "fastest load mode here; '' for its default mapping), e.g. '-fa off'")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localspec" / "peer")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--gpu-layers", type=int, default=0,
                    help="layers offloaded, localspec's target and drafter and the native tool's (-ngl, -ngld)")
    args = ap.parse_args(argv)
    if not args.prompts:
        args.prompts = [Path(__file__).with_name(f"{name}.jsonl") for name in SETS]
    native = [k for k in args.native.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    for k in native:
        if k not in NATIVE:
            ap.error(f"unknown native type {k!r} ({', '.join(NATIVE)})")
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r} ({', '.join(MODES)})")
    if args.threads != "default" and not (args.threads.isdigit() and int(args.threads) > 0):
        ap.error(f"--threads must be a positive number or 'default' (got {args.threads!r})")
    threads = None if args.threads == "default" else int(args.threads)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    tool = build_tool(args.cache) if native else None
    spec = resolve(args.model)
    target, drafter = Path(spec.target), Path(spec.drafter) if spec.drafter else None
    if drafter is None:
        native = [k for k in native if k != "draft-eagle3"]
    results = {}
    gpu = ["-ngl", str(args.gpu_layers), "-ngld", str(args.gpu_layers)] if args.gpu_layers else []
    load_start = os.getloadavg()[0]
    hog = busy_core() if args.busy else None
    try:
        with Engine(target, drafter, n_ctx=args.ctx, n_threads=threads, n_gpu_layers=args.gpu_layers,
                    drafter_gpu_layers=args.gpu_layers) as engine:
            engine.cost_model()  # calibrate before the clock runs, as a user's first chat would have
            for path in args.prompts:
                results[str(path)] = bench_set(path, engine, tool, native, modes, args.max_tokens, threads,
                                               target, drafter, args.limit, args.exact_n,
                                               shlex.split(args.native_args) + gpu, args.repeats)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    names = [f"native:{k}" for k in native] + modes
    print(f"{args.threads} threads{', one core busy' if args.busy else ''}, {args.max_tokens} tokens, "
          f"fastest of {args.repeats} per prompt, load average {load_start:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end, native arguments {args.native_args!r} "
          f"(ratios: to native:plain; median: of the per-prompt ratios)")
    print_tables(results, names, modes)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "busy": args.busy, "repeats": args.repeats, "max_tokens": args.max_tokens,
                                         "target": target.name, "native_args": args.native_args, "load_average": [load_start, os.getloadavg()[0]],
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
