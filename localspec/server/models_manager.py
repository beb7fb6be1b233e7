"""Every model in the store, loaded on demand: one :class:`~.worker.EngineWorker` per loaded model.

A request names a model (``name`` or ``name:latest``; none: the model ``serve`` was started with);
:meth:`ModelManager.acquire` gives its :class:`Loaded` at once when it is loaded, else loads it.
Loads run one at a time on a thread of their own (never on the event loop, never on an engine's
thread), so the requests of the loaded models go on meanwhile; the requests for a model being
loaded wait for it, at most ``queue_size`` of them (429 beyond).

Memory: the device budgets (``--ram``, ``--vram`` or the free memory at start) are shared. A model
is planned (:func:`localspec.memory.pair.plan_engine`) in what the loaded models leave of them;
when it does not fit there at its full context, or ``--max-loaded`` models are already loaded, the
least recently used idle model is unloaded first, and the plan is made again. A model that does
not fit even alone is one clear error.

A model stays loaded for its ``keep_alive`` after its last request ends (Ollama's: 5 minutes by
default, 0: unload at once, negative: keep); the model ``serve`` was started with is kept until a
request says otherwise or it is evicted.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..core.errors import LocalspecError
from ..core.names import is_model_name, shown as shown_name, without_latest
from ..runtime.engine import Engine
from ..store import registry
from ..store.models import DEFAULT_MODEL, ModelSpec, resolve
from . import model_holds
from ..memory.pair import DoesNotFit
from .errors import ModelDoesNotFit, ModelError, ModelLoadFailed, ModelNotFound, queue_full, shutting_down
from .metrics import ServerMetrics
from .params import ServeDefaults
from .worker import EngineWorker, Job, log

DEFAULT_KEEP_ALIVE = 300.0   # seconds (Ollama's 5m)
MAX_KEEP_ALIVE = (2**63 - 1) / 1e9   # seconds: Go's longest time.Duration, which Ollama's keep_alive is
DRAIN_TICK = 0.05            # how often a model being drained is looked at (seconds)
EXPIRY_TICK = 0.25           # how often expired models are looked for (seconds)


class NoRoom(LocalspecError):
    """The model's plan does not fit what the loaded models leave of the budget."""


@dataclass
class Settings:
    """What ``serve``'s command line gives every model it loads."""

    settings: Callable[[ModelSpec], tuple[int, Optional[int], ServeDefaults]]   # spec -> (ctx, threads, defaults)
    queue_size: int
    cache_bytes: int = 0
    gpu_layers: Optional[int] = None
    parallel: Optional[int] = None
    verbose: bool = False
    max_loaded: Optional[int] = None
    ram: Optional[int] = None
    vram: Optional[int] = None
    keep_alive: Optional[float] = DEFAULT_KEEP_ALIVE
    kv_layout: str = "auto"      # the target's KV with several slots (runtime.kv_layout)
    stream_interval: float = 0.0   # seconds a stream's later text may wait to join the next (--stream-interval-ms)


@dataclass
class Loaded:
    """One loaded model: its engine, its worker thread, its request defaults and memory."""

    name: str
    spec: ModelSpec
    engine: Engine
    worker: EngineWorker
    defaults: ServeDefaults
    device_bytes: dict          # device name -> bytes the plan uses there
    gpu_bytes: int
    load_seconds: float
    keep_alive: Optional[float]  # seconds after the last request (None: keep)
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    idle_since: float = field(default_factory=time.monotonic)
    jobs: list = field(default_factory=list)
    stamp: object = None          # the store record's identity when loaded (:func:`record_stamp`)
    shape: tuple = ()             # (context, threads) it was loaded with: a change needs a reload
    holds: int = 0                # requests between their admission and their last event
    draining: bool = False        # to be unloaded once idle: no new request takes it

    @property
    def names(self) -> list[str]:
        """The names a request may give it: its own, and its target file's."""
        target = self.spec.target
        return [self.name] + [n for n in dict.fromkeys((target.name, target.stem)) if n != self.name]

    @property
    def memory_bytes(self) -> int:
        return sum(self.device_bytes.values())

    def hold(self) -> None:
        """A request holds this model from its admission to its last event (:mod:`.model_holds`)."""
        self.holds += 1
        self.last_used = self.idle_since = time.monotonic()

    def release(self) -> None:
        self.holds = max(0, self.holds - 1)
        self.idle_since = time.monotonic()

    async def admit(self, job: Job) -> None:
        """Check ``job``'s grammar and tokenize its prompt off the engine thread (a 400 naming its
        field; other clients' tokens go on meanwhile), then queue it."""
        await self.worker.check(job)
        await self.worker.prepare(job)
        self.submit(job)

    def submit(self, job: Job) -> None:
        """Queue ``job`` on this model's worker (429 when its queue is full)."""
        self.worker.submit(job)
        self.jobs.append(job)
        self.last_used = time.monotonic()

    def busy(self) -> bool:
        """A request runs or waits (a job's response ends by setting its ``cancel``)."""
        self.jobs = [j for j in self.jobs if not j.cancel.is_set()]
        if self.holds or self.jobs or self.worker.running_count() or self.worker.waiting_count():
            self.idle_since = time.monotonic()
            return True
        return False

    def expires_at(self) -> Optional[float]:
        """Wall-clock time it unloads if nothing uses it (None: never)."""
        if self.keep_alive is None:
            return None
        keep = min(self.keep_alive, MAX_KEEP_ALIVE)
        if self.busy():
            return time.time() + keep
        return time.time() + max(0.0, keep - (time.monotonic() - self.idle_since))


def parse_keep_alive(value) -> Optional[float]:
    """Ollama's ``keep_alive``: a Go duration ("5m", "1h30m", "10s"), seconds (number or digits),
    0 (unload now) or negative (keep); None: keep. ValueError when it is none of those, or longer
    than Go's ``time.Duration`` holds (MAX_KEEP_ALIVE, about 292 years): Ollama parses into one,
    and its ``time.ParseDuration`` refuses such a string ("99999999999h") with a 400."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _go_duration(text)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(value)
    if abs(seconds) > MAX_KEEP_ALIVE and (seconds > 0 or isinstance(value, str)):
        raise ValueError(value)   # Go's ParseDuration overflows either way; a negative number is "keep"
    if seconds < 0:
        return None   # negative: keep (Ollama saturates it to the longest duration)
    return seconds


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _go_duration(text: str) -> float:
    import re

    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(text)
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


class ModelManager:
    """The loaded models, loads, evictions and keep-alive expiry (see the module's docstring)."""

    def __init__(self, settings: Settings, budgets: list, *, default: ModelSpec) -> None:
        self.settings = settings
        self.budgets = {b.name: b.budget_bytes for b in budgets}    # device -> bytes, shared by the models
        self.gpus = [b.name for b in budgets if b.is_gpu]
        self.default = default
        self.loaded: dict[str, Loaded] = {}
        self.metrics = ServerMetrics(default.name, running=self.running_count, waiting=self.waiting_count)
        self._loading: dict[str, asyncio.Future] = {}
        self._waiters: dict[str, int] = {}
        self._lock = threading.Lock()           # one load or unload at a time
        self._load_order = asyncio.Lock()       # loads one at a time, in the order they were asked for
        self._closing = False
        self._costs: dict = {}                  # cost-model key -> the figures a loaded engine had
        self._expiry: Optional[asyncio.Task] = None

    # -- state --
    @property
    def closing(self) -> bool:
        return self._closing

    def running_count(self) -> int:
        return sum(m.worker.running_count() for m in list(self.loaded.values()))

    def waiting_count(self) -> int:
        return sum(m.worker.waiting_count() for m in list(self.loaded.values()))

    def loading(self) -> list[str]:
        """The models being loaded now."""
        return list(self._loading)

    def default_name(self) -> str:
        return self.default.name

    # -- names --
    def canonical(self, name: Optional[str]) -> str:
        """The store's name a request's ``model`` means (404 when the store has none by it)."""
        if name is None or name == "":
            return self.default.name
        for m in list(self.loaded.values()):
            if name in m.names:
                return m.name
        bare = without_latest(name)
        if bare == self.default.name or bare in self.loaded:
            return bare
        if not is_model_name(bare):
            raise unknown(name)
        try:
            if registry.load(bare) is not None:
                return bare
        except LocalspecError as exc:
            raise ModelLoadFailed(bare, f"The model '{bare}' cannot be read: {exc}") from None
        entry = registry.catalog_entry(bare)
        if (entry is not None and entry.embedded) or bare == DEFAULT_MODEL:
            return bare
        raise unknown(name)

    def spec(self, name: str) -> ModelSpec:
        if name == self.default.name:
            return self.default
        try:
            return resolve(name)
        except LocalspecError as exc:
            raise ModelNotFound(name, f"The model '{name}' cannot be loaded: {exc}") from None

    # -- acquiring --
    async def acquire(self, name: Optional[str], keep_alive=...) -> Loaded:
        """The loaded model ``name`` means, loading it first if need be, held by the request in
        progress until its response ends (:mod:`.model_holds`). ``keep_alive`` (seconds, None:
        keep; ``...``: leave as it is) applies from this request on. A model whose store record
        changed since it loaded is read again (its settings) or reloaded (its files, context or
        template), as Ollama reads a model per request."""
        key = self.canonical(name)
        loaded = self.loaded.get(key)
        if loaded is not None and not loaded.draining and self._current(loaded):
            model_holds.hold(loaded)   # no await since the check: nothing unloads it in between
        else:
            loaded = await self._wait_load(key)
        if keep_alive is not ...:
            loaded.keep_alive = keep_alive
        loaded.last_used = time.monotonic()
        return loaded

    def _current(self, loaded: Loaded) -> bool:
        """Whether ``loaded`` still is what the store says (its record read again when its file
        changed: new settings are taken in place); False: it drains, and the next load reads it anew."""
        stamp = record_stamp(loaded.name)
        if stamp == loaded.stamp:
            return True
        try:
            spec = self.spec(loaded.name)
            ctx, threads, defaults = self.settings.settings(spec)
        except (ModelError, LocalspecError):   # removed or damaged: served no more once its requests end
            loaded.draining = True
            raise unknown(loaded.name) from None
        old = loaded.spec
        if (spec.target, spec.drafter, spec.template) == (old.target, old.drafter, old.template) \
                and (ctx, threads) == loaded.shape and defaults.policy == loaded.defaults.policy:
            loaded.spec, loaded.defaults, loaded.stamp = spec, defaults, stamp
            log(f"{loaded.name}: its record changed; its settings were read again")
            return True
        log(f"{loaded.name}: its record changed; it reloads once its requests end")
        loaded.draining = True
        return False

    async def _wait_load(self, key: str) -> Loaded:
        if self._closing:
            raise shutting_down()
        if self._waiters.get(key, 0) >= self.settings.queue_size:
            self.metrics.rejected.inc()
            raise queue_full(self.settings.queue_size)
        future = self._loading.get(key)
        if future is None or future.done():   # a finished load has served its waiters: ask again
            stamp = record_stamp(key)   # before the record is read: a change after it is seen next time
            spec = self.spec(key)
            future = asyncio.ensure_future(self._load(key, spec, stamp))
            self._loading[key] = future
            future.add_done_callback(lambda f: self._loading.pop(key) if self._loading.get(key) is f else None)
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            loaded = await asyncio.shield(future)
        except asyncio.CancelledError:   # the client left: the hold the load made for it goes
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().release()
            raise
        except DoesNotFit as exc:   # the plan or the files: this request's error, the server goes on
            raise ModelDoesNotFit(key, f"The model '{key}' cannot be loaded: {exc}") from None
        except LocalspecError as exc:
            raise ModelLoadFailed(key, f"The model '{key}' cannot be loaded: {exc}") from None
        finally:
            self._waiters[key] -= 1
        model_holds.adopt(loaded)   # the hold _load took for this waiter, before anything could drain it
        return loaded

    @staticmethod
    def in_use(m: Loaded) -> bool:
        """A request holds, runs or waits on ``m``."""
        return m.busy()

    # -- loading: one at a time, in arrival order; the room made by draining idle models --
    async def _load(self, key: str, spec: ModelSpec, stamp: object) -> Loaded:
        """``key`` loaded (or found loaded), with a hold for each request waiting for it, taken
        before the next load may look for a model to drain."""
        async with self._load_order:
            loaded = await self._load_in_order(key, spec, stamp)
            for _ in range(self._waiters.get(key, 0)):
                loaded.hold()
            return loaded

    async def _load_in_order(self, key: str, spec: ModelSpec, stamp: object) -> Loaded:
        loop = asyncio.get_running_loop()
        while True:
            if self._closing:
                raise shutting_down()
            current = self.loaded.get(key)
            if current is not None and not current.draining:
                return current
            if current is not None:   # its record changed: unloaded once its requests end
                await self._drain(current, "its record changed")
                continue
            if self.settings.max_loaded is not None and len(self.loaded) >= self.settings.max_loaded:
                await self._drain(self._victim(key), f"--max-loaded {self.settings.max_loaded}", key)
                continue
            try:
                return await loop.run_in_executor(None, self._open_locked, key, spec, stamp)
            except NoRoom as exc:
                await self._drain(self._victim(key, str(exc)), str(exc), key)

    def _victim(self, key: str, why: str = "") -> Loaded:
        """The model to unload for ``key``: the least recently used, idle ones first."""
        if not self.loaded:
            raise DoesNotFit(why or f"the model '{key}' does not fit")
        return min(self.loaded.values(), key=lambda m: (self.in_use(m), m.last_used))

    async def _drain(self, victim: Loaded, why: str, key: Optional[str] = None) -> None:
        """Unload ``victim`` (for ``key``'s room) once its requests have ended (none start on it
        meanwhile): a request holds its model from admission to its last event, so none is cut short."""
        victim.draining = True
        room = f" to make room for {key}" if key is not None else ""
        if self.in_use(victim):
            log(f"{victim.name} unloads{room} once its requests end ({why})")
        while self.in_use(victim):
            if self._closing:
                raise shutting_down()
            await asyncio.sleep(DRAIN_TICK)
        log(f"unloading {victim.name}{room} ({why})")
        await asyncio.get_running_loop().run_in_executor(None, self._unload_if_loaded, victim)

    def _unload_if_loaded(self, victim: Loaded) -> None:
        with self._lock:
            if self.loaded.get(victim.name) is victim:
                self._unload_locked(victim)

    def load_now(self, spec: ModelSpec, keep_alive: Optional[float] = None) -> Loaded:
        """Load ``spec`` in this thread (``serve MODEL``'s preload): LocalspecError when it does not fit."""
        loaded = self._open_locked(spec.name, spec, record_stamp(spec.name))
        loaded.keep_alive = keep_alive
        return loaded

    def _open_locked(self, key: str, spec: ModelSpec, stamp: object) -> Loaded:
        with self._lock:
            if key in self.loaded:
                return self.loaded[key]
            loaded = self._open(key, spec, strict=bool(self.loaded))
            loaded.stamp = stamp
            self.loaded[key] = loaded
            return loaded

    def _remaining(self) -> dict[str, int]:
        left = dict(self.budgets)
        for m in self.loaded.values():
            for device, used in m.device_bytes.items():
                if device in left:
                    left[device] -= used
        return left

    def _open(self, key: str, spec: ModelSpec, *, strict: bool) -> Loaded:
        from ..memory.planner import KV_PREFERENCE
        from ..runtime.loading import load_engine

        s = self.settings
        for label, path in (("target", spec.target), ("drafter", spec.drafter)):
            if path is not None and not Path(path).is_file():
                raise LocalspecError(f"the {label} file {path} does not exist")
        ctx, threads, defaults = s.settings(spec)
        left = self._remaining()
        ram = max(0, left.get("CPU", 0)) if (s.ram is not None or len(self.loaded)) else None
        vram = max(0, left[self.gpus[0]]) if self.gpus and (s.vram is not None or len(self.loaded)) else None
        start = time.monotonic()
        # beside other models: the full context at the best KV type, or the LRU idle model goes first
        kv = KV_PREFERENCE[0] if strict else None

        def planned(plan) -> None:   # before anything is loaded
            if strict and plan.context_note:
                raise NoRoom(plan.context_note)
            if plan.context_note:
                log(f"{key}: {plan.context_note}")

        try:
            engine = load_engine(spec, n_ctx=ctx, n_threads=threads, gpu_layers=s.gpu_layers, vram=vram,
                                 parallel=s.parallel, ram=ram, kv_type=kv, source=defaults.policy.source,
                                 verbose=s.verbose, on_plan=planned, rows_match=defaults.rows_match,
                                 kv_layout=s.kv_layout)
        except DoesNotFit as exc:   # the plan's own refusal
            if strict:
                raise NoRoom(str(exc)) from None
            raise
        plan = engine.memory_plan
        try:
            self._warm_up(engine, defaults, key)
            worker = EngineWorker(engine, lambda **_live: self.metrics, queue_size=s.queue_size,
                                  cache_bytes=s.cache_bytes, stream_interval=s.stream_interval)
            worker.start()
        except BaseException:
            engine.close()
            raise
        used = {d.name: d.used_bytes for d in plan.devices}
        gpu = sum(d.used_bytes for d in plan.devices if d.is_gpu)
        seconds = time.monotonic() - start
        log(f"loaded {key} in {seconds:.2f} s ({_mib(sum(used.values()))} planned)")
        return Loaded(key, spec, engine, worker, defaults, used, gpu, seconds, s.keep_alive, shape=(ctx, threads))

    def _warm_up(self, engine: Engine, defaults: ServeDefaults, name: str) -> None:
        """The cost model the auto policy plans with, never in a request's time: from a model loaded
        earlier over the same files and settings (also a calibration that an overloaded machine cut
        short, which the calibration cache does not keep), else from the calibration cache, else
        measured in the background while the engine is idle (requests meanwhile plan with what
        exists: :mod:`localspec.runtime.calibrator`), each change of state in the log."""
        if not (defaults.spec and defaults.policy.name == "auto"):
            return
        known = self._costs.get(engine.cost_key())
        if known is not None:
            engine.cost = copy.deepcopy(known)
            return

        def changed(state: str) -> None:
            if state == "running" and engine.calibrator.runs > 1:
                return   # a retry after a pause: said once
            cost = engine.cost
            detail = (f" (V(1) {cost.verify(1) * 1e3:.2f} ms, V(8) {cost.verify(8) * 1e3:.2f} ms, cached)"
                      if state == "done" and cost is not None else "")
            log(f"{name}: {engine.calibrator.describe()}{detail}")
        engine.calibrator.listeners.append(changed)
        engine.calibrate_in_background()
        if engine.calibrator.state == "cached":
            log(f"{name}: {engine.calibrator.describe()}")

    # -- unloading --
    def _unload_locked(self, loaded: Loaded) -> None:
        self.loaded.pop(loaded.name, None)
        if loaded.worker.stop():
            if loaded.engine.cost is not None:   # its live figures, for the next load of these files
                self._costs[loaded.engine.cost_key()] = copy.deepcopy(loaded.engine.cost)
            loaded.engine.close()
        else:
            log(f"{loaded.name}: its engine thread did not stop; its memory is kept until exit")

    def unload_blocking(self, name: str) -> bool:
        """Unload ``name`` now (requests still running on it end with 503); False when it is not loaded."""
        with self._lock:
            loaded = self.loaded.get(name)
            if loaded is None:
                return False
            log(f"unloading {name}")
            self._unload_locked(loaded)
            return True

    def retire(self, name: str) -> None:
        """``name`` serves no new request and unloads once its running ones end (its record was
        removed or replaced: the next request reads the store again)."""
        loaded = self.loaded.get(name)
        if loaded is not None:
            loaded.draining = True

    async def unload(self, name: str) -> bool:
        """Unload ``name`` once the other requests on it have ended (Ollama's ``keep_alive: 0``:
        none is cut short); none starts on it meanwhile. False when it is not loaded."""
        loaded = self.loaded.get(name)
        if loaded is None:
            return False
        loaded.draining = True   # on the event loop: no request takes it from here on
        own = model_holds.held_here(loaded)
        while (loaded.holds > own or loaded.worker.running_count() or loaded.worker.waiting_count()) \
                and not self._closing:
            await asyncio.sleep(DRAIN_TICK)
        return await asyncio.get_running_loop().run_in_executor(None, self.unload_blocking, name)

    def _is_expired(self, m: Loaded) -> bool:
        """Idle past its keep_alive, or drained (its record removed or changed) and idle."""
        if self.in_use(m):
            return False
        return m.draining or (m.keep_alive is not None and time.monotonic() - m.idle_since >= m.keep_alive)

    async def _expire_forever(self) -> None:
        """Unload the models idle past their keep_alive; decided on the event loop, where requests
        take their holds, so that none takes a model being unloaded."""
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(EXPIRY_TICK)
            for m in list(self.loaded.values()):
                if m.stamp is not None and record_stamp(m.name) is None:
                    m.draining = True   # its record was removed (``localspec rm``, another process)
                if self._is_expired(m):
                    log(f"unloading {m.name} ({'drained' if m.draining else 'keep_alive expired'})")
                    m.draining = True
                    await loop.run_in_executor(None, self._unload_if_loaded, m)

    # -- life --
    def start(self) -> None:
        """On the event loop (the app's lifespan): keep-alive expiry begins."""
        self._expiry = asyncio.ensure_future(self._expire_forever())

    def abort(self) -> None:
        """Shutdown begins: every worker refuses new and queued requests and stops its running ones."""
        self._closing = True
        for m in list(self.loaded.values()):
            m.worker.abort()

    def close(self) -> None:
        """Stop every worker and close its engine."""
        self._closing = True
        if self._expiry is not None:
            self._expiry.cancel()
        with self._lock:
            for m in list(self.loaded.values()):
                self._unload_locked(m)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def unknown(name: str) -> ModelNotFound:
    return ModelNotFound(name, f"model '{shown_name(name)}' not found (see /api/tags or /v1/models for the models "
                               "this server has)")


def record_stamp(name: str) -> object:
    """The identity of the store record of ``name`` (None: it has none): what changes when
    ``create``, ``cp`` or ``rm`` (this server's or another process's) rewrites or removes it."""
    if not is_model_name(name):
        return None
    try:
        st = (registry.models_dir() / f"{name}.json").stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def store_names() -> list[str]:
    """Every model a request may name: the user's models, then the catalog's embedded ones and the default."""
    names = [m.name for m in registry.list_models()]
    for name, entry in registry.load_catalog().items():
        if entry.embedded and name not in names:
            names.append(name)
    if DEFAULT_MODEL not in names:
        names.append(DEFAULT_MODEL)
    return names


def openai_models(manager: ModelManager, created: int, *, paths: bool = False) -> list[dict]:
    """``/v1/models``' ``data``: every model in the store (a request's ``model`` loads it). ``meta``
    names the model's files; their paths only with ``paths`` (serve --expose-paths: a client on the
    network has no business with the user's directories)."""
    shown = str if paths else (lambda path: Path(path).name)

    def entry(name: str, spec: ModelSpec) -> dict:
        loaded = manager.loaded.get(name)
        return {"id": name, "object": "model", "created": created, "owned_by": "localspec", "meta": {
            "target": shown(spec.target), "drafter": shown(spec.drafter) if spec.drafter else None,
            "n_ctx": loaded.engine.n_ctx if loaded else None,
            "speculative": loaded.defaults.spec if loaded else None, "loaded": loaded is not None}}

    out = []
    for name in store_names():
        try:
            spec = manager.default if name == manager.default.name else resolve(name)
        except LocalspecError:
            continue   # a damaged record or a catalog entry not downloaded: not servable
        out.append(entry(name, spec))
    if manager.default.name not in {m["id"] for m in out}:   # a --target file: served under its own name
        out.insert(0, entry(manager.default.name, manager.default))
    return out
