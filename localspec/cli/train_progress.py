"""The progress display of ``localspec train``: one rich bar per stage, loss and held-out estimate."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressView:
    def __init__(self, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=self.console,
                                 disable=not enabled)
        self.tasks: dict[str, int] = {}
        self.tau = None

    def __enter__(self) -> "ProgressView":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def log(self, message: str) -> None:
        self.console.print(message)

    def _task(self, name: str, total: float) -> int:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total, info="")
        return self.tasks[name]

    def update(self, e: dict) -> None:
        kind = e.get("event")
        if kind == "gen":
            t = self._task("generate", e["total"])
            self.progress.update(t, completed=e["done"], info=f"{e['tokens']} tokens, {e['tok_s']:.0f} tok/s")
        elif kind == "features":
            t = self._task("features", e["total"])
            self.progress.update(t, completed=e["done"], info=f"{e['done']}/{e['total']} sequences")
        elif kind == "step":
            t = self._task("train", e["budget"])
            tau = f", held-out tok/cycle {self.tau:.2f}" if self.tau is not None else ""
            self.progress.update(t, completed=min(e["elapsed"], e["budget"]),
                                 info=f"step {e['step']} loss {e['loss']:.3f} acc {e['acc0']:.2f}{tau}")
        elif kind == "eval":
            self.tau = e["tau"]
            self.console.print(f"held-out: tokens/cycle {e['tau']:.3f} (chain of 4, walked as the runtime does; "
                               f"{e['tau_all']:.3f} from every position), first-draft accuracy "
                               f"{e['first_acc']:.3f}, loss {e['loss']:.3f} at step {e['step']}")
