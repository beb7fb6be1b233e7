"""Make the README's chat screenshot (docs/chat.svg): a real exchange with the embedded default model.

Runs `localspec chat`'s app headless under Textual's Pilot, sends the prompts, waits for each reply and
saves Textual's own SVG screenshot. Offline; a fresh temporary LOCALSPEC_HOME unless --home is given.

    python scripts/chat_screenshot.py                     # writes docs/chat.svg
    python scripts/chat_screenshot.py -o /tmp/chat.svg --size 100x30 --prompt "..." --prompt "..."
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["What are the three primary colours? Answer in one sentence.",
           "Write a Python function that returns the squares of a list of numbers."]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "chat.svg")
    parser.add_argument("--prompt", action="append", help="a user message (repeat for several turns)")
    parser.add_argument("--size", default="100x34", help="terminal COLUMNSxROWS")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, the same reply every run")
    # the EAGLE drafter drafts every cycle, so the acceptance by depth shows (auto, the default, drafts only
    # where the calibrated costs say it pays: on a 2-core CPU, mostly lookup on repeats)
    parser.add_argument("--policy", default="fixed", choices=["auto", "fixed"])
    parser.add_argument("--draft-max", type=int, default=4)
    parser.add_argument("--repeat-penalty", type=float, default=1.0, help="1: off (the chat's default is 1.1)")
    parser.add_argument("--threads", type=int, default=None, help="default: as `localspec chat`, every core but one")
    parser.add_argument("--highlight", action="store_true", help="show drafted tokens highlighted (Ctrl+G)")
    parser.add_argument("--home", type=Path, default=None, help="LOCALSPEC_HOME (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each reply")
    return parser.parse_args(argv)


async def wait_for(pilot, condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("Error: timed out waiting for the chat")
        await pilot.pause(0.05)
    await pilot.pause(0.3)          # let the last refresh (stats, Markdown) land


async def take(args: argparse.Namespace) -> str:
    from localspec.cli.chat import engine_factory
    from localspec.llama.llama_model import default_threads
    from localspec.store.conversations import ConversationStore
    from localspec.store.models import resolve
    from localspec.tui.app import ChatApp
    from localspec.tui.settings import ChatSettings

    columns, rows = (int(n) for n in args.size.lower().split("x"))
    spec = resolve(None)
    threads = args.threads or default_threads(reserve=1)
    settings = ChatSettings(max_tokens=args.max_tokens, temperature=args.temperature, policy=args.policy,
                            draft_max=args.draft_max, repeat_penalty=args.repeat_penalty)
    with ConversationStore() as store:
        app = ChatApp(engine_factory(spec, ctx=2048, threads=threads), model_name=spec.name,
                      store=store, settings=settings)
        async with app.run_test(size=(columns, rows)) as pilot:
            await wait_for(pilot, lambda: app.engine is not None or app.load_error is not None, args.timeout)
            if app.load_error:
                raise SystemExit(f"Error: {app.load_error}")
            calibrator = getattr(app.engine, "calibrator", None)   # the status line clean, the cores free
            await pilot.pause(1.0)
            await wait_for(pilot, lambda: calibrator is None or not calibrator.busy, args.timeout)
            if args.highlight:
                await pilot.press("ctrl+g")
            for n, prompt in enumerate(args.prompt or PROMPTS, 1):
                if not app.send(prompt):
                    raise SystemExit("Error: the chat did not take the prompt")
                await wait_for(pilot, lambda: app.replies_done >= n, args.timeout)
            return app.export_screenshot(title="localspec chat")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="localspec-screenshot-") as tmp:
        os.environ["LOCALSPEC_HOME"] = str(args.home or tmp)
        svg = asyncio.run(take(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(f".{args.output.name}.partial-{os.getpid()}")
    partial.write_text(svg, encoding="utf-8")
    partial.replace(args.output)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"wrote {args.output} ({len(svg):,} bytes); load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
