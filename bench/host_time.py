"""Host time per cycle: what a generation spends outside llama.cpp's compute, per source.

    python bench/host_time.py [--model NAME | --target T.gguf --draft D.gguf] [--threads 2] [-n 64] \\
        [--modes plain,lookup,recall,prediction,eagle-chain,eagle-tree,auto,slots4-plain,slots4-chain] \\
        [--prompts bench/copy.jsonl] [--limit 3] [--native] [--cache DIR] [--profile N] [--json out.json]

On a GPU a target step of a small model takes ~4 ms and a drafter step ~0.3 ms (docs/gpu.md):
whatever the host spends per cycle outside them (feature copies, the policy, sampling,
bookkeeping) is paid on top, and llama.cpp's own loop is C++. This isolates that share. Every
``llama_decode``, ``llama_encode`` and ``llama_process`` (the target's and the drafter's compute) is timed in
process; a mode's host time is its generation wall time (after the prompt, as
``GenerationStats.generation_seconds``) less the time inside those calls, reported in µs per cycle
(one target decode) and per drafted token. Everything else is host: Python, numpy, the ctypes
calls that fill batches and read logits, the policy, the lookup index, the text stream.

Modes (greedy, each on every prompt, interleaved prompt by prompt so a change of machine load
hits them alike; the best of ``--repeats`` runs):
- ``plain``: no drafts;
- ``lookup``: a fixed n-gram lookup chain of 4 (``--policy fixed --source lookup``);
- ``recall``: ``auto`` with lookup only, on a prompt it answered just before (drafts from recall);
- ``prediction``: a fixed lookup chain of 4 with the plain answer as Predicted Outputs;
- ``eagle-chain``: a fixed EAGLE chain of 4 (``--source eagle --tree off``);
- ``eagle-tree``: a fixed EAGLE tree (``--tree on``);
- ``auto``: the default policy;
- ``slots4-plain`` / ``slots4-chain`` / ``slots4-auto``: four requests at once in one engine of
  four slots (the scheduler of ``serve --parallel 4``), plain, EAGLE chains or the default policy
  (what a served C = 4 level runs); per step (one decode of every slot's rows) and per slot-cycle.
``--native`` adds llama.cpp's ``llama-speculative-simple`` on the same prompts (built once from the
pinned sdist, as bench/peer_llamacpp.py builds it): ``plain`` (ngram-mod that never matches),
``ngram-mod`` (its defaults: a 24-token match, 48 drafts at least, which on chat-length answers
drafts nothing) and ``ngram-mod-chain`` (a chain of 1 to 4 drafts from a 4-token match: what
``lookup`` does), its host time read from its own timings: the decode loop's wall time less the
target's eval and prompt-eval time (llama_perf) after the prompt pass. That is the anchor.
``--profile N`` prints the N costliest Python functions of each mode (cProfile, own time), the
place to cut. Absolute figures move with machine load: compare ratios taken in one run, and say
the load (``uptime``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp

from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.llama import hostloop
from localspec.runtime.bench import load_prompts
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.runtime.scheduler import Scheduler
from localspec.speculation.policy import PolicyConfig
from localspec.store.models import resolve

BENCH = Path(__file__).resolve().parent
MODES = ("plain", "lookup", "recall", "prediction", "eagle-chain", "eagle-tree", "auto", "slots4-plain",
         "slots4-chain", "slots4-auto")
CONFIGS = {
    "plain": dict(spec=False),
    "lookup": dict(policy=PolicyConfig("fixed", 4, source="lookup")),
    "recall": dict(policy=PolicyConfig("auto", source="lookup")),
    "prediction": dict(policy=PolicyConfig("fixed", 4, source="lookup")),
    "eagle-chain": dict(policy=PolicyConfig("fixed", 4, source="eagle", tree="off")),
    "eagle-tree": dict(policy=PolicyConfig("fixed", 4, source="eagle", tree="on")),
    "auto": dict(),
    "slots4-plain": dict(spec=False),
    "slots4-chain": dict(policy=PolicyConfig("fixed", 4, source="eagle", tree="off")),
    "slots4-auto": dict(),
}
EAGLE_MODES = {"eagle-chain", "eagle-tree", "slots4-chain"}


class NativeClock:
    """Seconds inside llama.cpp's compute calls (``llama_decode``, ``llama_encode``, ``llama_process``), process-wide."""

    NAMES = ("llama_decode", "llama_process", "llama_encode")

    def __init__(self) -> None:
        self._seconds = 0.0
        self._cpu = 0.0      # this thread's CPU seconds inside them (time.thread_time: a busy machine's
        self.calls = 0       # preemptions do not count, so host CPU time holds under load)
        self._orig = {}

    # with the decodes the C host loop ran itself (llama.hostloop: a greedy draft chain's)
    @property
    def seconds(self) -> float:
        return self._seconds + hostloop.decode_clock()[0]

    @property
    def cpu(self) -> float:
        return self._cpu + hostloop.decode_clock()[1]

    def install(self) -> "NativeClock":
        hostloop.count_decode_cpu()
        for name in self.NAMES:
            fn = self._orig[name] = getattr(llama_cpp, name)
            setattr(llama_cpp, name, self._timed(fn))
        return self

    def _timed(self, fn):
        clock, cpu = time.perf_counter, time.thread_time

        def timed(*args):
            t0, c0 = clock(), cpu()
            try:
                return fn(*args)
            finally:
                self._seconds += clock() - t0
                self._cpu += cpu() - c0
                self.calls += 1
        return timed


class AfterPrefill:
    """An observer: the native clock when the prompt is in (generation time starts just after)."""

    def __init__(self, clock: NativeClock) -> None:
        self.clock, self.native0, self.cpu0, self.native_cpu0 = clock, None, None, None

    def after_prefill(self, ctx, sampler) -> None:
        self.native0, self.native_cpu0, self.cpu0 = self.clock.seconds, self.clock.cpu, time.thread_time()
    # no after_verify: a probe read every cycle would add its own call to the host time it measures


def one(engine: Engine, clock: NativeClock, messages, config: GenerationConfig, profile=None) -> dict:
    """One generation alone: its host seconds after the prompt, cycles and drafts."""
    tokens = engine.prepare(messages)
    probe = AfterPrefill(clock)
    if profile is not None:
        profile.enable()
    if hasattr(Scheduler, "step_rows"):   # the one driver: a scheduler of one slot, as Engine.generate
        done = _one_slot(engine, tokens, config, probe)
    else:                                   # a localspec from before it (a baseline run: open_slot, run)
        done = _alone(engine, tokens, config, probe)
    native = clock.seconds - probe.native0
    cpu, native_cpu = time.thread_time() - probe.cpu0, clock.cpu - probe.native_cpu0
    if profile is not None:
        profile.disable()
    s = done.stats
    return {"seconds": s.generation_seconds, "native": native, "cpu": cpu, "native_cpu": native_cpu,
            "cycles": s.cycles, "drafted": s.drafted,
            "accepted": s.accepted, "tokens": s.generated_tokens, "text": done.text}


def _one_slot(engine: Engine, tokens: list[int], config: GenerationConfig, probe) -> DoneEvent:
    events: list = []
    sched = _scheduler(engine, slots=1, hold=True)
    try:
        sched.admit(tokens, config, None, events.append, observers=[probe])
        while sched.active:
            sched.step()
    finally:
        sched.close()
    return next(e for e in events if isinstance(e, DoneEvent))


def _scheduler(engine: Engine, **kw):
    """The engine's scheduler (``Engine.scheduler``; a localspec from before it: the engine itself)."""
    return engine.scheduler(**kw) if hasattr(engine, "scheduler") else Scheduler(engine, **kw)


def _alone(engine: Engine, tokens: list[int], config: GenerationConfig, probe) -> DoneEvent:
    calibrator = getattr(engine, "calibrator", None)   # None: a localspec from before it
    if not (calibrator.acquire() if calibrator is not None else engine._lock.acquire(blocking=False)):
        raise SystemExit("engine busy")
    try:
        loop = engine.open_slot(engine.verifier, tokens, config, None, observers=[probe])
        return next(e for e in loop.run() if isinstance(e, DoneEvent))
    finally:
        calibrator.release() if calibrator is not None else engine._lock.release()


def slots(engine: Engine, clock: NativeClock, prompts: list[list[Message]], config: GenerationConfig,
          profile=None) -> dict:
    """Len(prompts) requests at once through the scheduler: host seconds per step after every prompt is in."""
    sched = _scheduler(engine)
    dones: list[DoneEvent] = []
    for messages in prompts:
        sched.admit(engine.prepare(messages), config, None,
                    lambda e: dones.append(e) if isinstance(e, DoneEvent) else None)
    while (sched.prefilling if hasattr(sched, "prefilling")
           else any(s.loop is not None and s.loop.prefilling for s in sched.slots)):
        sched.step()
    t0, n0, steps = time.perf_counter(), clock.seconds, 0
    c0, nc0 = time.thread_time(), clock.cpu
    if profile is not None:
        profile.enable()
    while sched.active:
        sched.step()
        steps += 1
    if profile is not None:
        profile.disable()
    seconds, native = time.perf_counter() - t0, clock.seconds - n0
    cpu, native_cpu = time.thread_time() - c0, clock.cpu - nc0
    cycles = sum(d.stats.cycles for d in dones)
    return {"seconds": seconds, "native": native, "cpu": cpu, "native_cpu": native_cpu, "cycles": steps,
            "slot_cycles": cycles,
            "drafted": sum(d.stats.drafted for d in dones), "accepted": sum(d.stats.accepted for d in dones),
            "tokens": sum(d.stats.generated_tokens for d in dones)}


def host_figures(runs: list[dict]) -> dict:
    """µs of host time per cycle and per drafted token over ``runs``, and the host share."""
    seconds = sum(r["seconds"] for r in runs)
    host = max(0.0, seconds - sum(r["native"] for r in runs))
    cycles = sum(r["cycles"] for r in runs)
    drafted = sum(r["drafted"] for r in runs)
    cpu_host = sum(r["cpu"] - r["native_cpu"] for r in runs if "cpu" in r)
    out = {"host_us_per_cycle": round(host / cycles * 1e6, 1) if cycles else None,
           # the generating thread's CPU time outside llama.cpp's compute: what the host costs, a
           # machine's load aside (wall time counts the thread's waits for a core too)
           "host_cpu_us_per_cycle": round(cpu_host / cycles * 1e6, 1) if cycles and runs and "cpu" in runs[0] else None,
           "host_cpu_us_per_drafted": round(cpu_host / drafted * 1e6, 1) if drafted and runs and "cpu" in runs[0] else None,
           "host_us_per_drafted": round(host / drafted * 1e6, 1) if drafted else None,
           "host_share": round(host / seconds, 4) if seconds else None,
           "native_ms_per_cycle": round((seconds - host) / cycles * 1e3, 3) if cycles else None,
           "cycles": cycles, "drafted": drafted, "accepted": sum(r["accepted"] for r in runs),
           "tokens": sum(r["tokens"] for r in runs)}
    if runs and "slot_cycles" in runs[0]:
        slot_cycles = sum(r["slot_cycles"] for r in runs)
        out["host_us_per_slot_cycle"] = round(host / slot_cycles * 1e6, 1) if slot_cycles else None
    return out


# -- llama.cpp's own loop -------------------------------------------------------------------------
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
P_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms")
EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def native_run(tool: Path, kind: str, target: Path, text: str, n: int, threads: int, gpu_layers: int = 0) -> dict:
    """One ``llama-speculative-simple`` run: its decode loop's host seconds from its own timings.
    The target context's llama_perf counts every decode (the prompt pass too, in prompt eval):
    compute during the loop = prompt eval + eval - the prompt pass (its wall time, an upper bound
    of its compute, so the host figure is if anything low)."""
    from peer_llamacpp import NATIVE, NATIVE_ARGS
    cmd = [str(tool), "-m", str(target), "-p", text, "-n", str(n), "--temp", "0", "--seed", "1", "-c", "4096",
           "-t", str(threads), "-tb", str(threads), "-ngl", str(gpu_layers), *NATIVE[kind], *NATIVE_ARGS.split()]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = proc.stdout + proc.stderr
    dec, enc, pe, ev = DECODED.search(log), ENCODED.search(log), P_EVAL.search(log), EVAL.search(log)
    if proc.returncode != 0 or not (dec and enc and pe and ev):
        raise SystemExit(f"{tool.name} {kind} failed (exit {proc.returncode}):\n" + "\n".join(log.splitlines()[-8:]))
    wall, enc_s = float(dec.group(2)), float(enc.group(2))
    compute = (float(pe.group(1)) + float(ev.group(1))) / 1e3 - enc_s
    tokens = int(dec.group(1))
    drafted = int(DRAFTED.search(log).group(1)) if DRAFTED.search(log) else 0
    accepted = int(ACCEPTED.search(log).group(1)) if ACCEPTED.search(log) else 0
    return {"seconds": wall, "native": compute, "cycles": max(1, tokens - accepted), "drafted": drafted,
            "accepted": accepted, "tokens": tokens}


# -- driver -------------------------------------------------------------------------------------
def run_modes(engine: Engine, multi: Engine | None, clock: NativeClock, prompts, modes: list[str], n: int,
              repeats: int, profiles: dict) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for bp in prompts:
        messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
        plain_text = None
        for mode in modes:
            best = None
            for _ in range(repeats):
                r = run_mode(engine, multi, clock, messages, mode, n, profiles.get(mode), plain_text)
                if mode == "plain":
                    plain_text = r.get("text")
                best = r if best is None or host_of(r) < host_of(best) else best
            if best is not None:
                best.pop("text", None)
                runs[mode].append(best)
    return runs


def host_of(r: dict) -> float:
    return (r["seconds"] - r["native"]) / max(1, r["cycles"])


def run_mode(engine: Engine, multi: Engine | None, clock: NativeClock, messages, mode: str, n: int, profile,
             plain_text: str | None) -> dict:
    config = GenerationConfig(max_tokens=n, **CONFIGS[mode])
    engine.clear_cache()
    if mode.startswith("slots4"):
        multi.clear_cache()
        for v in multi.verifiers:
            v.forget()
        return slots(multi, clock, [messages] * len(multi.verifiers), config, profile)
    if mode == "recall":   # the same request just before: its text is recalled
        one(engine, clock, messages, config)
        engine.verifier.forget()
    if mode == "prediction":
        if plain_text is None:
            plain_text = one(engine, clock, messages, GenerationConfig(max_tokens=n, spec=False))["text"]
            engine.clear_cache()
        config = GenerationConfig(max_tokens=n, prediction=plain_text, **CONFIGS[mode])
    return one(engine, clock, messages, config, profile)


def print_table(results: dict) -> None:
    cols = ("host_cpu_us_per_cycle", "host_cpu_us_per_drafted", "host_us_per_cycle", "host_us_per_drafted",
            "native_ms_per_cycle", "cycles", "drafted", "accepted")
    short = {"host_cpu_us_per_cycle": "cpu us/cycle", "host_cpu_us_per_drafted": "cpu us/draft",
             "host_us_per_cycle": "wall us/cycle", "host_us_per_drafted": "wall us/draft",
             "native_ms_per_cycle": "llama ms/cycle"}
    print(f"{'mode':<20}" + "".join(f"{short.get(c, c):>15}" for c in cols))
    for mode, fig in results.items():
        print(f"{mode:<20}" + "".join(f"{str(fig.get(c)):>15}" for c in cols))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--prompts", type=Path, nargs="*", default=[BENCH / "copy.jsonl", BENCH / "chat.jsonl"])
    ap.add_argument("--limit", type=int, default=3, help="prompts per set")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--native", action="store_true", help="llama-speculative-simple's host time as the anchor")
    ap.add_argument("--tool", type=Path, help="a built llama-speculative-simple (else built into --cache)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localspec" / "peer")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print each mode's N costliest functions")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown modes {bad}; choose from {', '.join(MODES)}")
    spec = resolve(args.model, target=args.target, draft=args.draft)
    if spec.drafter is None:
        modes = [m for m in modes if m not in EAGLE_MODES]
    prompts = [p for path in args.prompts for p in load_prompts(path)[:args.limit]]
    clock = NativeClock().install()
    # CPU time of this thread: a busy machine's preemptions do not land on whatever ran then
    profiles = {m: cProfile.Profile(time.thread_time) for m in modes} if args.profile else {}
    load = os.getloadavg()
    with Engine(spec.target, spec.drafter, n_threads=args.threads, n_ctx=4096, n_gpu_layers=args.gpu_layers,
                drafter_gpu_layers=args.gpu_layers) as engine:
        engine.cost_model()   # calibrated (or cached) before anything is timed
        multi = None
        if any(m.startswith("slots4") for m in modes):
            multi = Engine(spec.target, spec.drafter, n_threads=args.threads, n_ctx=1024, parallel=4,
                           n_gpu_layers=args.gpu_layers, drafter_gpu_layers=args.gpu_layers)
        try:
            runs = run_modes(engine, multi, clock, prompts, modes, args.n, args.repeats, profiles)
        finally:
            if multi is not None:
                multi.close()
        formatter = engine.formatter
        texts = [formatter.render(([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)],
                                  add_generation_prompt=True) for p in prompts]
    results = {m: host_figures(r) for m, r in runs.items()}
    if args.native:
        sys.path.insert(0, str(BENCH))
        from peer_llamacpp import build_tool
        tool = args.tool or build_tool(args.cache)
        for kind in ("plain", "ngram-mod", "ngram-mod-chain"):
            results[f"llama.cpp {kind}"] = host_figures(
                [native_run(tool, kind, spec.target, t, args.n, args.threads, args.gpu_layers) for t in texts])
    load_after = os.getloadavg()
    print(f"host time per cycle, {spec.name}, {args.threads} threads, -n {args.n}, {len(prompts)} prompts; "
          f"load {load[0]:.2f} -> {load_after[0]:.2f} ({os.cpu_count()} CPUs)")
    print_table(results)
    for mode, prof in profiles.items():
        print(f"\n== {mode}: the {args.profile} costliest functions (own time) ==")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    if args.json:
        args.json.write_text(json.dumps({"model": spec.name, "threads": args.threads, "n": args.n,
                                         "load": [load[0], load_after[0]], "results": results,
                                         "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
