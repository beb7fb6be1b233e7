"""Every value a user can set, declared once: its type, range, default, help text, CLI flag,
Modelfile PARAMETER and request field, checked before llama.cpp, numpy or the file system sees it.

Each surface is generated from :data:`OPTIONS` or checked against it (``tests/test_option_surfaces.py``
walks them all): the Typer options (``localspec.cli.flags``), the server's pydantic request fields
(``Option.constraints``), the Modelfile PARAMETER table (``localspec.formats.modelfile.PARAMETERS``),
the chat's settings and the Python API's dataclass defaults (``SamplingParams``, ``CHAT_SAMPLING``,
``PolicyConfig``, ``GenerationConfig``, ``GenerationOptions``, ``ChatSettings``: :func:`default`,
:func:`chat_default`); bench files check through it too. A check says what is wrong with a value
(``"must be in (0, 1], got 2"``); each caller names the value its own way: the API by its field
name (``top_p must be ...``), the CLI with its flag appended (``top_p must be ..., got 2
(--top-p)``), a Modelfile by its PARAMETER, the server by the request field in ``param``.

Integer widths: sizes and counts are llama.cpp ``int32``; the seed is a ``uint32`` (numpy's
generator takes it as is), ``-1`` (or no seed) meaning a random one. Floats must be finite.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Iterable

from .errors import LocalspecError

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
N_CTX_MIN = 16            # llama.cpp asserts on contexts of a few tokens (its output buffer rows)
MAX_THREADS = 512         # GGML_MAX_N_THREADS: ggml indexes fixed arrays by thread
MAX_SEQUENCES = 256       # LLAMA_MAX_SEQ: sequences of one llama.cpp context
DRAFT_MAX = 32            # deepest drafter chain, and fixed's depth (--draft-max)
LOOKUP_MAX = 128          # deepest n-gram lookup draft of auto (speculation.policy.MAX_DEPTH)
TREE_MAX_NODES = 32       # draft nodes of one tree (each leaf a llama.cpp sequence)
TREE_MAX_WIDTH = 8        # branches per tree depth (the drafter context's sequences)
TOP_LOGPROBS_MAX = 20     # most probable alternatives reported per token (OpenAI's limit)
RANDOM_SEED = -1          # seed -1: a random seed, as llama.cpp's LLAMA_DEFAULT_SEED
DEFAULT_CTX = 4096        # context size when none is asked for (--ctx, Engine, the memory plan's cap)
KV_LAYOUTS = ("auto", "streams", "unified")   # the target KV with several slots (runtime.kv_layout)
AUTO_DRAFT_MAX = 16       # policy auto: the draft depth it chooses up to, unless --draft-max is given
FIXED_DRAFT_MAX = 4       # policy fixed: the depth it always drafts, unless --draft-max is given


ENV_TRUE = frozenset({"1", "on", "yes", "true", "y"})    # words an environment switch reads as on
ENV_FALSE = frozenset({"", "0", "off", "no", "false", "n"})


def env_flag(name: str) -> bool:
    """An environment switch (``LOCALSPEC_MMAP=1``): on, off (unset or empty: off), or a
    LocalspecError naming the variable."""
    value = os.environ.get(name, "").strip().lower()
    if value in ENV_TRUE:
        return True
    if value in ENV_FALSE:
        return False
    raise LocalspecError(f"{name} must be 1 or 0 (got '{value}')")


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """An environment word (``LOCALSPEC_HOSTLOOP=numpy``): one of ``choices`` (unset or empty:
    ``default``), or a LocalspecError naming the variable and the words it takes."""
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise LocalspecError(f"{name} must be " + " or ".join(f"'{c}'" for c in choices) + f" (got '{value}')")
    return value


_SAME = object()   # Option.chat: the same default as the Python API's


@dataclass(frozen=True)
class Option:
    """One value: its type, its range (closed unless ``*_open``), extra accepted values and choices,
    its default and where users set it (CLI flag, Modelfile PARAMETER, request field)."""

    name: str
    kind: type                         # int, float, str or bool
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    special: tuple = ()                # values accepted outside the range (e.g. seed -1)
    choices: tuple = ()                # str options: the accepted words (more: add_choice)
    listed: bool = False               # str options: a comma list of choices too ("mtp,lookup"; AUTO alone)
    flag: str | None = None            # the CLI flag that sets it (a bool: "--on/--off", the two switches)
    note: str = ""                     # what the special values mean, shown with the rule
    label: str = ""                    # the words errors use for it (default: its name)
    default: Any = None                # the Python API's and `generate`'s default (None: none, automatic)
    chat: Any = _SAME                  # the chat's and the server's default, where it differs
    help: str = ""                     # the CLI's help text
    short: str | None = None           # the CLI's short flag ("-n")
    arg: str | None = None             # the CLI commands' parameter name (default: name; n_ctx: ctx)
    parameter: str | None = None       # the Modelfile PARAMETER that sets it (Ollama's name)
    automatic: tuple = ()              # PARAMETER values meaning "automatic" (Ollama's num_predict -1)
    field: str | None = None           # the OpenAI request field that sets it

    @property
    def chat_default(self) -> Any:
        return self.default if self.chat is _SAME else self.chat

    @property
    def cli_name(self) -> str:
        return self.arg or self.name

    def constraints(self) -> dict[str, float]:
        """The range as pydantic/JSON-schema bounds (``ge``/``gt``/``le``/``lt``), widened over
        special values next to it (seed -1, threads 0) so that the table's own check decides them."""
        lo, hi, lo_open = self.lo, self.hi, self.lo_open
        if self.kind is int and lo is not None and self.special:
            while lo - 1 in self.special:
                lo -= 1
        out: dict[str, float] = {}
        if lo is not None:
            out["gt" if lo_open else "ge"] = self.kind(lo)
        if hi is not None:
            out["lt" if self.hi_open else "le"] = self.kind(hi)
        return out

    @property
    def words(self) -> tuple:
        """The accepted words: the declared choices and those registered since (add_choice)."""
        return self.choices + tuple(w for w in _ADDED.get(self.name, ()) if w not in self.choices)

    @property
    def rule(self) -> str:
        """The range in words: ">= 0", "in (0, 1]", "between 1 and 32", "auto or fixed"."""
        if self.choices:
            words = list(self.words)
            text = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
            return text + (f", or a comma list of them ({words[1]},{words[2]})" if self.listed and len(words) > 2 else "")
        lo, hi = self.lo, self.hi
        fmt = (lambda x: str(int(x))) if self.kind is int else (lambda x: f"{x:g}")
        if lo is not None and hi is not None:
            if self.kind is int:
                text = f"between {fmt(lo)} and {fmt(hi)}"
            else:
                text = f"in {'(' if self.lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if self.hi_open else ']'}"
        elif lo is not None:
            text = f"{'>' if self.lo_open else '>='} {fmt(lo)}"
        elif hi is not None:
            text = f"{'<' if self.hi_open else '<='} {fmt(hi)}"
        else:
            text = {float: "a finite number", bool: "true or false"}.get(self.kind, f"a {self.kind.__name__}")
        return f"{text} ({self.note})" if self.note else text

    def problem(self, value: Any) -> tuple[Any, str | None]:
        """(the value in its type, None) or (value, what is wrong: "must be >= 0, got -1")."""
        shown = _show(value)
        if self.kind is bool:
            if not isinstance(value, bool):
                return value, f"must be true or false, got {shown}"
            return value, None
        if self.kind is str:
            if not isinstance(value, str):
                return value, f"must be {self.rule}, got {shown}"
            if self.listed and self.choices and "," in value:
                return self._listed(value)
            if self.choices and value not in self.words:
                return value, f"must be {self.rule}, got '{value}'"
            return value, None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            what = "an integer" if self.kind is int else "a number"
            return value, f"must be {what}, got {shown}"
        if self.kind is int:
            if not isinstance(value, numbers.Integral):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    return value, f"must be an integer, got {shown}"
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                return value, f"must be a finite number, got {shown}"
        if value in self.special:
            return value, None
        lo_bad = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        hi_bad = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if lo_bad or hi_bad:
            return value, f"must be {self.rule}, got {shown}"
        return value, None

    def _listed(self, value: str) -> tuple[Any, str | None]:
        """A comma list of choices: each one known, none twice, ``auto`` (the first choice) alone."""
        names = [w.strip() for w in value.split(",")]
        for name in names:
            if name not in self.words or name == self.choices[0]:
                what = f"'{name}' is not one" if name != self.choices[0] else f"'{name}' stands alone"
                return value, f"must be {self.rule}, got '{value}' ({what})"
        if len(set(names)) != len(names):
            return value, f"must be {self.rule}, got '{value}' (a word twice)"
        return ",".join(names), None

    def check(self, value: Any, *, where: str | None = None) -> Any:
        """The value in its type, or LocalspecError naming it: ``NAME must be ..., got V``;
        ``where`` (e.g. the CLI flag) is added in parentheses."""
        value, bad = self.problem(value)
        if bad:
            raise LocalspecError(f"{self.label or self.name} {bad}" + (f" ({where})" if where else ""))
        return value


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_ADDED: dict[str, list[str]] = {}   # words registered beyond an option's declared choices


def add_choice(name: str, word: str) -> None:
    """Accept ``word`` for option ``name`` from now on (a draft source registered by its module:
    localspec.speculation.sources.register)."""
    added = _ADDED.setdefault(name, [])
    if word not in OPTIONS[name].choices and word not in added:
        added.append(word)


def remove_choice(name: str, word: str) -> None:
    """Undo :func:`add_choice` (a source unregistered)."""
    added = _ADDED.get(name, [])
    if word in added:
        added.remove(word)


def listed_words(value: str) -> tuple[str, ...]:
    """The words of a checked value of a ``listed`` option (``"mtp,lookup"`` -> ("mtp", "lookup"))."""
    return tuple(value.split(",")) if "," in value else (value,)


def _int(name, lo=None, hi=INT32_MAX, **kw) -> Option:
    return Option(name, int, lo, hi, **kw)


def _float(name, lo=None, hi=None, **kw) -> Option:
    return Option(name, float, lo, hi, **kw)


# The table: every user value, once. Chat defaults (``localspec chat``, the server): llama.cpp's
# sampler (common/common.h: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) plus Ollama's repeat
# penalty (1.1 over the last 64 tokens): llama.cpp leaves it off, but small chat models such as
# SmolLM2-135M loop without it (asked "Name three colours of the rainbow." greedily, it repeats one
# heading until the 512-token limit). top-p stays llama.cpp's 0.95 rather than Ollama's 0.9, since
# min-p 0.05 (Ollama: 0) already cuts the tail; presence and frequency penalties stay off (0), as in both.
OPTIONS: dict[str, Option] = {o.name: o for o in (
    # sampling (SamplingParams)
    _int("max_tokens", 1, flag="--max-tokens", short="-n", label="max tokens", default=256, chat=512,
         help="Most tokens to generate.", parameter="num_predict", automatic=(-1, -2), field="max_tokens"),
    _float("temperature", 0.0, flag="--temperature", short="-t", note="0: greedy", default=0.0, chat=0.8,
           help="0: greedy.", parameter="temperature", field="temperature"),
    _int("top_k", 0, flag="--top-k", note="0: off", default=40, help="Keep the k most probable tokens (0: off).",
         parameter="top_k", field="top_k"),
    _float("top_p", 0.0, 1.0, lo_open=True, flag="--top-p", default=0.95,
           help="Keep the most probable tokens up to this probability mass (1: off).", parameter="top_p",
           field="top_p"),
    _float("min_p", 0.0, 1.0, flag="--min-p", default=0.05,
           help="Drop tokens less probable than this times the most probable one (0: off).", parameter="min_p",
           field="min_p"),
    _int("seed", 0, UINT32_MAX, special=(RANDOM_SEED,), flag="--seed", note="-1: random",
         help="Sampling seed (reproducible output).", parameter="seed", field="seed"),
    _int("top_logprobs", 0, TOP_LOGPROBS_MAX, flag="--top-logprobs", label="top_logprobs", field="top_logprobs"),
    # penalties (SamplingParams; as llama.cpp: repeat 1 = off, presence/frequency 0 = off)
    _float("repeat_penalty", 0.0, 10.0, lo_open=True, flag="--repeat-penalty", note="1: off", default=1.0,
           chat=1.1, help="Divide positive, multiply negative logits of recent tokens (1: off).",
           parameter="repeat_penalty", field="repeat_penalty"),
    _int("repeat_last_n", -1, flag="--repeat-last-n", note="-1: the whole context, 0: off", default=64,
         help="Recent tokens the penalties count, prompt included (0: off, -1: all).", parameter="repeat_last_n",
         field="repeat_last_n"),
    _float("presence_penalty", -2.0, 2.0, flag="--presence-penalty", note="0: off", default=0.0,
           help="Subtract from the logit of every recent token (OpenAI's; 0: off).", parameter="presence_penalty",
           field="presence_penalty"),
    _float("frequency_penalty", -2.0, 2.0, flag="--frequency-penalty", note="0: off", default=0.0,
           help="Subtract times each recent token's count (OpenAI's; 0: off).", parameter="frequency_penalty",
           field="frequency_penalty"),
    # speculation (PolicyConfig)
    Option("policy", str, choices=("auto", "fixed"), flag="--policy", default="auto",
           help="auto: adaptive; fixed: always draft --draft-max.", parameter="draft_policy"),
    Option("source", str, choices=("auto", "eagle", "lookup", "mtp", "assistant", "dflash", "dspark"), listed=True,
           flag="--source",
           label="draft source", default="auto",
           help="Draft sources: auto (every one there is: the model drafter and n-gram lookup), eagle (the drafter "
                "file), lookup, mtp (the target's own MTP heads), assistant (a Gemma 4 assistant as the drafter "
                 "file), dflash / dspark (a DFlash or DSpark block drafter file), or a comma list weighed against each other "
                "(mtp,lookup)."),
    Option("tree", str, choices=("auto", "on", "off"), flag="--tree", label="tree setting", default="auto",
           help="Drafter trees: auto (where the cost model says width is nearly free, as on GPUs), "
                "on (always), off (chains only).", parameter="draft_tree"),
    _int("draft_max", 1, DRAFT_MAX, flag="--draft-max", parameter="draft_max",
         help=f"Most tokens drafted per cycle (default: auto {AUTO_DRAFT_MAX}, fixed {FIXED_DRAFT_MAX})."),
    _int("lookup_max", 1, LOOKUP_MAX, default=LOOKUP_MAX),
    _float("p_min", 0.0, 1.0, flag="--p-min", default=0.3, parameter="draft_p_min",
           help="auto: the drafter stops drafting below this confidence."),
    _int("probe_every", 1, default=16),
    _int("tree_width", 1, TREE_MAX_WIDTH, label="tree width", default=4),
    _int("tree_nodes", 1, TREE_MAX_NODES, label="tree nodes", default=24),
    Option("recall", bool, flag="--recall/--no-recall", default=True, parameter="draft_recall", field="recall",
           help="Draft from the text of this engine's earlier generations, every client's (--no-recall: from "
                "each generation's own text only, so that no client's answer times depend on another's text)."),
    # model and context (Engine, the memory plan)
    _int("n_ctx", N_CTX_MIN, flag="--ctx", arg="ctx", default=DEFAULT_CTX, help="Context size in tokens.",
         parameter="num_ctx"),
    _int("threads", 1, MAX_THREADS, special=(0,), flag="--threads", note="0: automatic", parameter="num_thread",
         automatic=(0,), help="CPU threads (default: all available cores, fewer while other processes keep "
                              "cores busy)."),
    Option("rows_match", bool, flag="--rows-match/--no-rows-match", default=False, parameter="rows_match",
           field="rows_match",
           help="Exact mode: greedy text identical with and without drafts on a CPU at any thread count, and "
                "whatever other requests ran before or beside it: every row on one attention path (plain steps "
                "as two rows, batches under 64 rows). Costs speed on long prompts "
                "(docs/speculation.md#exact-mode)."),
    _int("gpu_layers", -1, flag="--gpu-layers", note="-1: all",
         help="Target layers to offload to the GPU (-1: all; default: from the memory plan)."),
    # serving (localspec serve)
    Option("kv_layout", str, choices=KV_LAYOUTS, flag="--kv-layout", label="KV layout", default="auto",
           help="The target's KV cache with several slots: streams (one per slot), unified (one pool), or auto "
                "(streams, unless --rows-match or a Gemma 4 assistant needs the pool)."),
    _int("cache_ram", 0, flag="--cache-ram", label="prompt cache size", note="0: off", default=1024,
         help="MiB of memory for the prompts of slots that moved on, loaded again when a request "
              "repeats them (0: off)."),
    _int("parallel", 1, MAX_SEQUENCES, flag="--parallel", default=1,
         help="Sequences decoded together in one batch, each in a slot (a llama.cpp sequence) of its own."),
    # drafter training (localspec train)
    _int("max_new", 1, flag="--max-new", default=320, help="Response length limit while generating."),
    _int("draft_vocab", 16, flag="--draft-vocab", default=8192, help="Draft vocabulary size."),
    _int("ttt_steps", 1, 64, flag="--ttt-steps", default=4, help="Training-time test unroll depth."),
    _int("batch_tokens", 64, flag="--batch-tokens", default=2048, help="Tokens per training batch."),
    _int("max_steps", 0, flag="--max-steps", note="0: the time budget only", default=0,
         help="Stop training after this many steps (0: time budget only)."),
    _float("lr", 0.0, 1.0, lo_open=True, flag="--lr", default=1e-3, help="Learning rate."),
    _int("train_threads", 1, MAX_THREADS, flag="--train-threads", help="torch threads."),
)}


def default(name: str) -> Any:
    """The declared default of option ``name`` (the Python API's, ``generate``'s)."""
    return OPTIONS[name].default


def chat_default(name: str) -> Any:
    """The chat's (and the server's) default of option ``name``."""
    return OPTIONS[name].chat_default


def check(name: str, value: Any, *, where: str | None = None) -> Any:
    """``OPTIONS[name].check(value)``: the value in its type, or one-line LocalspecError."""
    return OPTIONS[name].check(value, where=where)


def check_cli(values: dict[str, Any]) -> dict[str, Any]:
    """Options from command-line flags (None: not given): errors name the value and its flag."""
    out = {}
    for name, value in values.items():
        opt = OPTIONS[name]
        out[name] = value if value is None else opt.check(value, where=opt.flag)
    return out


def check_seed(seed: Any, *, where: str | None = None) -> int | None:
    """A seed for numpy's generator: None for a random one (no seed, or -1)."""
    if seed is None:
        return None
    seed = check("seed", seed, where=where)
    return None if seed == RANDOM_SEED else seed


def check_stop(stop: Any) -> tuple[str, ...]:
    """Stop strings: a sequence of text; empty ones never match and are dropped."""
    if isinstance(stop, str):
        stop = (stop,)
    try:
        items = tuple(stop)
    except TypeError:
        raise LocalspecError(f"stop must be a list of strings, got {_show(stop)}") from None
    for s in items:
        if not isinstance(s, str):
            raise LocalspecError(f"stop strings must be text, got {_show(s)}")
        check_text("a stop string", s)
    return tuple(s for s in items if s)


def check_n_ctx(n_ctx: Any, n_ctx_train: int | None = None, *, model: str = "the model",
                where: str | None = None) -> int:
    """A context size: at least :data:`N_CTX_MIN`, an int32, and at most the context the model was
    trained for (``n_ctx_train`` from its GGUF header; 0 or None: unknown)."""
    n_ctx = check("n_ctx", n_ctx, where=where)
    if n_ctx_train and n_ctx > n_ctx_train:
        raise LocalspecError(f"n_ctx {n_ctx} is above the {n_ctx_train} tokens {model} was trained for"
                             + (f" ({where})" if where else ""))
    return n_ctx


def check_threads(n: Any, *, where: str | None = None) -> int:
    return check("threads", n, where=where)


def threads_warning(n: int | None) -> str | None:
    """A warning when ``n`` llama.cpp threads exceed the cores this process may use (its workers
    spin while they wait: more threads than cores runs many times slower)."""
    if not n:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    if n > cores:
        return (f"warning: {n} threads on {cores} core{'s' if cores != 1 else ''}: llama.cpp's threads spin "
                f"while they wait, so more threads than cores is much slower (try --threads {cores})")
    return None


def check_text(what: str, text: str) -> str:
    """Text that can be encoded as UTF-8: a command-line argument with invalid bytes arrives as lone
    surrogates (Python's surrogateescape), a JSON file can spell one out (``"\\ud800"``)."""
    if not isinstance(text, str):
        raise LocalspecError(f"{what} must be text, got {_show(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        code = ord(bad)
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise LocalspecError(f"{what} is not valid UTF-8 text ({byte} at character {exc.start})") from None
    return text


def check_messages(messages: Iterable) -> None:
    """Chat messages: each with a text role and text content."""
    if isinstance(messages, (bytes, dict)) or not hasattr(messages, "__iter__"):
        raise LocalspecError(f"a prompt is text or a list of messages, got {type(messages).__name__}")
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if not isinstance(role, str) or not role:
            raise LocalspecError(f"a message needs a role (system, user or assistant), got {_show(role)}")
        check_text("the prompt" if role == "user" else f"the {role} message", content)
