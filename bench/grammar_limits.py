"""Where llama.cpp's GBNF grammar code crashes or stalls (issue 36): the numbers behind the limits
in ``localspec.llama.grammar`` (docs/server.md, "Limits").

Each probe runs in a child process (a stack overflow kills it: exit -11), on a thread of the
default stack size, as the server's engine thread and request threads are:

    python bench/grammar_limits.py depth      # nested groups: ( ( ( "a" ) ) )
    python bench/grammar_limits.py chain      # rules whose first element is the next rule
    python bench/grammar_limits.py alts       # alternatives (an enum): init, one full-vocabulary mask
    python bench/grammar_limits.py schema     # maxLength / maxItems / enum through the JSON-schema converter

Model: the embedded SmolLM2-135M (49152 tokens). Times are wall seconds on whatever machine runs
it: compare ratios, and read the machine's load beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time


def _child(kind: str, n: int) -> None:
    import numpy as np

    from localspec.core.paths import embedded_target
    from localspec.llama import grammar as G
    from localspec.llama.llama_model import Model

    model = Model(embedded_target())
    if kind == "depth":
        text = "root ::= " + "(" * n + '"a"' + ")" * n
    elif kind == "chain":
        text = "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "x"\n' for i in range(n)) + f'r{n} ::= "a"\n'
    elif kind == "alts":
        text = "root ::= " + " | ".join(f'"\\"w{i}\\""' for i in range(n))
    else:
        from localspec.formats.json_grammar import schema_grammar
        which, _, size = kind.partition(":")
        schema = {"maxLength": {"type": "string", "maxLength": n},
                  "maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": n},
                  "enum": {"enum": [f"w{i}" for i in range(n)]}}[which]
        text = schema_grammar(schema)
    out: dict = {"bytes": len(text)}

    def run() -> None:
        t0 = time.perf_counter()
        import llama_cpp   # llama.cpp's parser directly: no bounds of ours in the way
        handle = llama_cpp.llama_sampler_init_grammar(model.vocab, text.encode(), G.ROOT)
        if not handle:
            out["refused"] = "llama.cpp returned NULL"
            return
        g = G.Grammar(model, text, _handle=handle)
        out["init_s"] = round(time.perf_counter() - t0, 4)
        logits = np.zeros(model.n_vocab, dtype=np.float32)
        t0 = time.perf_counter()
        masked = g.mask(logits)
        out["mask_s"] = round(time.perf_counter() - t0, 4)
        out["allowed"] = int(np.isfinite(masked).sum())
        g.close()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    print(json.dumps(out))


def probe(kind: str, n: int, timeout: float = 300) -> dict:
    try:
        r = subprocess.run([sys.executable, __file__, "--child", kind, str(n)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"n": n, "timeout": timeout}
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    return {"n": n, "rc": r.returncode, **(json.loads(lines[-1]) if lines else {"stderr": r.stderr[-200:]})}


SIZES = {"depth": [1000, 2000, 4000, 8000, 16000, 32000, 100000],
         "chain": [1000, 4000, 8000, 16000, 32000, 100000],
         "alts": [100, 1000, 2000, 4000, 8000, 16000],
         "schema": []}
SCHEMA = [("maxLength", 1000), ("maxLength", 100000), ("maxItems", 1000), ("maxItems", 100000),
          ("enum", 1000), ("enum", 4000)]

if __name__ == "__main__":
    if sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    what = sys.argv[1]
    cases = [(f"{k}:", n) for k, n in SCHEMA] if what == "schema" else [(what, n) for n in SIZES[what]]
    for kind, n in cases:
        print(json.dumps({"kind": kind, **probe(kind, n)}), flush=True)
