"""`python tests/pause_child.py STAGE ARGS...`: the CLI (`python -m localspec ARGS...`) with one pause
put in from the outside, so that a test can signal the process at a known point of a real run.

STAGE (or ``STAGE#N``: its Nth time; ``STAGE@S``: wait up to S seconds instead of 30) is one of:

- ``load``: inside llama.cpp's model-load progress callback (its first call);
- ``prefill``: before a decode of more than one token;
- ``bench-prompt``: after a bench prompt is finished and recorded;
- ``write:NAME``: an atomic write of NAME is complete, not yet renamed into place.

At the point the process prints ``localspec-test-pause: STAGE`` on stderr and waits (up to 30 s)
until a Ctrl-C is pending, or until SIGUSR1 lets it go on (a test that acts beside the paused
process, then releases it). The production code has no hook for this: the functions
are wrapped here before the CLI starts.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

MARKER = "localspec-test-pause: "


def main() -> int:
    want, args = sys.argv[1], sys.argv[2:]
    want, _, seconds = want.partition("@")
    stage, _, nth = want.partition("#")
    pause = _pauser(stage, int(nth or 1), float(seconds or 30))
    name, _, detail = stage.partition(":")
    {"load": _at_load, "prefill": _at_prefill, "bench-prompt": _at_bench_prompt, "write": _at_write}[name](pause, detail)
    sys.argv = ["localspec", *args]
    from localspec.cli import main as cli_main
    return cli_main()


def _pauser(stage: str, nth: int, seconds: float):
    hits = [0]
    resume = threading.Event()

    def pause() -> None:
        from localspec.core import interrupts
        hits[0] += 1
        if hits[0] != nth:
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: resume.set())
        print(MARKER + stage, file=sys.stderr, flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not interrupts.pending() and not resume.is_set():
            time.sleep(0.01)
    return pause


def _at_load(pause, _detail: str) -> None:
    from localspec.llama import weights_memory   # the load callback calls it by module attribute
    original = weights_memory.on_progress

    def on_progress() -> None:
        original()
        pause()
    weights_memory.on_progress = on_progress


def _at_prefill(pause, _detail: str) -> None:
    from localspec.llama.llama_model import Context
    original = Context.decode

    @functools.wraps(original)
    def decode(self, tokens, start_pos, *, all_logits):
        if len(tokens) > 1:
            pause()
        return original(self, tokens, start_pos, all_logits=all_logits)
    Context.decode = decode


def _at_bench_prompt(pause, _detail: str) -> None:
    from localspec.runtime import bench   # patched before the CLI imports run_bench by name
    original = bench.run_bench

    @functools.wraps(original)
    def run_bench(engine, prompts, base, progress=None, **kwargs):
        def each(i, result):
            if progress:
                progress(i, result)
            pause()
        return original(engine, prompts, base, each, **kwargs)
    bench.run_bench = run_bench


def _at_write(pause, name: str) -> None:
    original = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == name and Path(src).name.startswith(f".{name}.partial-"):
            pause()
        return original(src, dst, *args, **kwargs)
    os.replace = replace


if __name__ == "__main__":
    sys.exit(main())
