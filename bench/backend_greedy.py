"""What llama.cpp's backend greedy sampler would save a greedy target step, measured.

    python bench/backend_greedy.py [--target T.gguf] [--threads 2] [--rows 1] [--steps 200] [--gpu-layers 0]

Two target contexts on one model, alike but for a backend sampler chain of one ``greedy`` on
sequence 0 of the second (``llama_set_sampler``; ``n_outputs_max_per_seq`` raised so a verify's
rows fit). Their decodes alternate (so a change of machine load hits both), ``--rows`` rows a
decode, every row an output, as a verify of ``rows - 1`` drafts is. Per decode: the time inside
``llama_decode``, then the host's read of every row's token: ``llama_get_logits_ith`` and numpy's
argmax on the first context, ``llama_get_sampled_token_ith`` on the second. It checks that both
choose the same tokens and prints the medians and the best of each (docs/speculation.md, "Why a
plain cycle costs ~430 µs of host time").
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import llama_cpp as L

from localspec.core.paths import embedded_target
from localspec.llama.llama_model import Context, Model

_sampled = ctypes.CFUNCTYPE(ctypes.c_int32, L.llama_context_p_ctypes, ctypes.c_int32)(
    ("llama_get_sampled_token_ith", L.llama_cpp._lib))


def _greedy_chain():
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    return chain


def _contexts(model: Model, threads: int, rows: int) -> tuple[Context, Context, float]:
    """A plain context and one with the backend greedy sampler on sequence 0; the set's seconds."""
    default = L.llama_context_default_params

    def params():   # llama.cpp's default allows one output row per sequence with a backend sampler
        p = default()
        p.n_outputs_max_per_seq = max(rows, 1)
        return p
    L.llama_context_default_params = params
    try:
        plain = Context(model, n_ctx=1024, n_batch=512, n_threads=threads, n_outputs_max=129)
        backend = Context(model, n_ctx=1024, n_batch=512, n_threads=threads, n_outputs_max=129)
    finally:
        L.llama_context_default_params = default
    t0 = time.perf_counter()
    if not L.llama_set_sampler(backend.ptr, 0, _greedy_chain()):
        raise SystemExit("this build cannot run the greedy sampler on its backend")
    return plain, backend, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="target GGUF (default: the shipped SmolLM2-135M)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1, help="rows a decode, all outputs (a verify of rows-1 drafts)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gpu-layers", type=int, default=0)
    args = ap.parse_args()
    model = Model(args.target or embedded_target(), n_gpu_layers=args.gpu_layers)
    plain, backend, set_s = _contexts(model, args.threads, args.rows)
    prompt = model.tokenize("The capital of France is Paris. The capital of Italy is")
    n = len(prompt)
    first = {}
    for name, ctx in (("logits", plain), ("backend", backend)):
        t0 = time.perf_counter()
        ctx.decode(prompt, 0, all_logits=False)
        first[name] = time.perf_counter() - t0
    print(f"llama_set_sampler {set_s * 1e6:.0f} us; the next decode (a graph re-reserve) "
          f"{first['backend'] * 1e3:.1f} ms against {first['logits'] * 1e3:.1f} ms")
    times: dict[str, list[tuple[float, float]]] = {"logits": [], "backend": []}
    chosen: dict[str, list[list[int]]] = {"logits": [], "backend": []}
    tok = {"logits": int(plain.logits(n - 1).argmax()), "backend": _sampled(backend.ptr, n - 1)}
    for step in range(args.steps):
        order = (("logits", plain), ("backend", backend))
        for name, ctx in order if step % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            ctx.decode([tok[name]] * args.rows, n, all_logits=True)
            t1 = time.perf_counter()
            if name == "logits":
                out = [int(ctx.logits(r).argmax()) for r in range(args.rows)]
            else:
                out = [_sampled(ctx.ptr, r) for r in range(args.rows)]
            t2 = time.perf_counter()
            ctx.seq_rm(n)
            times[name].append((t1 - t0, t2 - t1))
            chosen[name].append(out)
    print(f"{args.rows} row(s) a decode, {args.threads} threads, {args.steps} decodes each; "
          f"the same tokens: {chosen['logits'] == chosen['backend']}")
    for name, rows in times.items():
        dec, read = [r[0] * 1e6 for r in rows], [r[1] * 1e6 for r in rows]
        print(f"  {name:8s} decode median {statistics.median(dec):8.0f} us, best {min(dec):8.0f} | "
              f"read median {statistics.median(read):6.1f} us, best {min(read):6.1f}")


if __name__ == "__main__":
    main()
