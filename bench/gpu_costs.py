"""Verify cost by batch shape on whatever llama.cpp backend llama-cpp-python was built with.

The figures the speculation cost model needs and a 2-core CPU cannot show: the median ms of one
``llama_decode`` of k rows with logits for all k (the verify step of a depth-(k-1) chain), the same
for S sequences in one decode each carrying 1 or 1+k rows (what issue 26's batch scheduler prices),
and one-row decodes at context depth. It measures random-weight GGUFs it builds itself, so any
model shape can be measured where no real weights can be brought (a lent GPU machine without
network): the cost of a decode depends on the shapes and weight types, not on the values.

    python bench/gpu_costs.py make --shape llama3-8b --out /tmp/l8b-f16.gguf --q4_0 /tmp/l8b-q4_0.gguf
    python bench/gpu_costs.py measure --model /tmp/l8b-q4_0.gguf --label llama3-8b/Q4_0 \
        --rows 1-16,24,32,48,64,96,128 --flash-attn on,off --seqs 1,2,4,8,16 --seq-rows 1,5,9 \
        --depths 1024,4096 --json gpu_costs.json

``make`` writes an F16 llama GGUF of a named shape (``tiny``, ``smollm2-135m``, ``llama3-8b``) with
a minimal SentencePiece-style vocab of the right size, and with ``--q4_0`` quantizes it through
``llama_model_quantize`` (all cores); ``quantize --src --dst [--type q4_0|q4_k_m|q8_0]`` quantizes
alone. The ``drafter-*`` shapes are one layer and a head of a target's width (a drafter step).
``measure`` offloads every layer (``--gpu-layers``), times each shape ``--reps`` times interleaved
(warm-up first; llama_synchronize before the clock stops; the slots' prefixes share one unified KV
cache), and merges one entry per ``--label`` into ``--json`` (written atomically), with the
backend's system info and, where ``nvidia-smi`` answers, the GPU. It runs on a CPU build too (use
small shapes there). For people who measure; CI does not run it. docs/gpu.md has the H200 figures
and bench/gpu/ the job that built and ran it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# name -> n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, rope_base, tied output
SHAPES = {
    "tiny": (64, 2, 4, 2, 128, 512, 10000.0, True),
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152, 100000.0, True),
    "llama3-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0, False),
    # one decoder layer and a head of each target's width: an EAGLE drafter step's shape, less its
    # fc (3 x n_embd -> n_embd) and its doubled attention input (Llama-3-8B's EAGLE-3 drafters
    # draft over a 32000-token vocabulary)
    "drafter-135m": (576, 1, 9, 3, 1536, 49152, 100000.0, False),
    "drafter-8b": (4096, 1, 32, 8, 14336, 32000, 500000.0, False),
}
FTYPES = {"q4_0": 2, "q8_0": 7, "q4_k_m": 15}   # llama_ftype values
N_SPECIAL = 3 + 256  # <unk> <s> </s> and the byte tokens; drawn tokens lie above them


def _vocab(writer, n_vocab: int) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - N_SPECIAL)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def make_model(shape: str, out: Path, seed: int = 0) -> Path:
    """An F16 llama GGUF of ``shape`` with random weights. Tensors of one shape share one array
    (the file holds copies), so memory stays at one layer's worth while writing many gigabytes."""
    import gguf

    n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, rope_base, tied = SHAPES[shape]
    head_dim = n_embd // n_head
    pool = (np.random.default_rng(seed).standard_normal(1 << 22) * 0.02).astype(np.float16)
    arrays: dict[tuple[int, ...], np.ndarray] = {}

    def weight(*dims: int) -> np.ndarray:
        if dims not in arrays:
            arrays[dims] = np.resize(pool, dims)
        return arrays[dims]

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random-{shape}")
    writer.add_context_length(8192)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(rope_base)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _vocab(writer, n_vocab)
    ones = np.ones(n_embd, np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", ones)
    if not tied:
        writer.add_tensor("output.weight", weight(n_vocab, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_head * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_head * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def quantize(src: Path, dst: Path, threads: int, ftype: str = "q4_0") -> float:
    import llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = FTYPES[ftype]
    t0 = time.perf_counter()
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"Error: llama_model_quantize returned {rc}")
    return time.perf_counter() - t0


class Bench:
    """One model, one context; decodes timed to the synchronize that ends them."""

    def __init__(self, model, n_ctx: int, flash_attn: bool, threads: int, seed: int = 0):
        import llama_cpp as L

        self.L = L
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = 16
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 1 if flash_attn else 0
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise SystemExit("Error: llama_init_from_model failed")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(512, 0, 16)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self.rng = random.Random(seed)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)

    def _fill(self, rows: list[tuple[int, int]], logits: bool) -> None:
        """rows: (seq, pos) pairs; random tokens."""
        b = self.batch
        for i, (seq, pos) in enumerate(rows):
            b.token[i] = self.rng.randrange(N_SPECIAL, self.n_vocab)
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(rows)

    def decode(self, rows: list[tuple[int, int]], logits: bool = True) -> float:
        self._fill(rows, logits)
        t0 = time.perf_counter()
        rc = self.L.llama_decode(self.ctx, self.batch)
        self.L.llama_synchronize(self.ctx)
        dt = (time.perf_counter() - t0) * 1e3
        if rc != 0:
            raise SystemExit(f"Error: llama_decode returned {rc} for {len(rows)} rows")
        return dt

    def prefill(self, seq: int, n: int) -> None:
        for start in range(0, n, 512):
            self.decode([(seq, p) for p in range(start, min(n, start + 512))], logits=False)

    def rm(self, seq: int, from_pos: int) -> None:
        self.L.llama_memory_seq_rm(self.mem, seq, from_pos, -1)


def _stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    return {"median_ms": round(statistics.median(times), 4), "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4)}


def timed_shapes(bench: Bench, shapes: dict, reps: int) -> dict:
    """shapes: key -> (list of (seq, pos) rows, list of (seq, from_pos) to remove after). Each shape
    is decoded once to warm up, then ``reps`` rounds in a shuffled order each round."""
    times: dict = {key: [] for key in shapes}
    order = list(shapes)
    for rnd in range(reps + 1):
        bench.rng.shuffle(order)
        for key in order:
            rows, cleanup = shapes[key]
            dt = bench.decode(rows)
            for seq, pos in cleanup:
                bench.rm(seq, pos)
            if rnd:
                times[key].append(dt)
    return {key: _stats(t) for key, t in times.items()}


def measure_run(bench: Bench, args) -> dict:
    prefix = args.prefix
    out: dict = {}
    bench.L.llama_memory_clear(bench.mem, True)
    for s in range(max(args.seqs)):
        bench.prefill(s, prefix)
    verify = {k: ([(0, prefix + i) for i in range(k)], [(0, prefix)]) for k in args.rows}
    res = timed_shapes(bench, verify, args.reps)
    out["verify_ms"] = {str(k): res[k]["median_ms"] for k in args.rows}
    out["verify_spread_ms"] = {str(k): [res[k]["p10_ms"], res[k]["p90_ms"]] for k in args.rows}
    multi = {}
    for n_seq in args.seqs:
        for r in args.seq_rows:
            rows = [(s, prefix + i) for s in range(n_seq) for i in range(r)]
            multi[(n_seq, r)] = (rows, [(s, prefix) for s in range(n_seq)])
    res = timed_shapes(bench, multi, args.reps)
    out["multi_seq"] = [{"seqs": s, "rows_per_seq": r, "total_rows": s * r, **res[(s, r)]} for (s, r) in multi]
    out["depth"] = []
    for depth in args.depths:
        bench.L.llama_memory_clear(bench.mem, True)
        bench.prefill(0, depth)
        shapes = {r: ([(0, depth + i) for i in range(r)], [(0, depth)]) for r in args.depth_rows}
        res = timed_shapes(bench, shapes, args.reps)
        out["depth"] += [{"depth": depth, "rows": r, **res[r]} for r in args.depth_rows]
    return out


def gpu_facts() -> dict:
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"gpu": line.strip()} if line.strip() else {}


def write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def cmd_measure(args) -> None:
    import llama_cpp as L

    if args.native_log:  # llama.cpp's own stderr logger instead of llama_cpp's Python callback
        L.llama_log_set(L.llama_log_callback(), None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = args.gpu_layers
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(str(args.model).encode(), mp)
    if not model:
        raise SystemExit(f"Error: cannot load {args.model}")
    desc = ctypes.create_string_buffer(256)
    L.llama_model_desc(model, desc, 256)
    entry = {"file": args.model.name, "desc": desc.value.decode(), "n_params": L.llama_model_n_params(model),
             "size_bytes": L.llama_model_size(model), "n_embd": L.llama_model_n_embd(model),
             "n_layer": L.llama_model_n_layer(model), "load_s": round(time.perf_counter() - t0, 2),
             "gpu_layers": args.gpu_layers, "threads": args.threads, "reps": args.reps, "prefix": args.prefix,
             "runs": {}}
    n_ctx = max([args.prefix + max(args.rows), max(args.seqs) * (args.prefix + max(args.seq_rows))]
                + [d + max(args.depth_rows) for d in args.depths])
    n_ctx = (n_ctx + 255) // 256 * 256
    for fa in args.flash_attn:
        bench = Bench(model, n_ctx, fa == "on", args.threads)
        t0 = time.perf_counter()
        entry["runs"][f"fa_{fa}"] = measure_run(bench, args)
        entry["runs"][f"fa_{fa}"]["seconds"] = round(time.perf_counter() - t0, 1)
        bench.close()
        v = entry["runs"][f"fa_{fa}"]["verify_ms"]
        print(f"{args.label} fa={fa}: " + " ".join(f"{k}:{ms:.2f}" for k, ms in v.items()), flush=True)
    L.llama_model_free(model)
    data = json.loads(args.json.read_text()) if args.json.exists() else {"models": {}}
    data.setdefault("models", {})[args.label] = entry
    data["system_info"] = L.llama_print_system_info().decode().strip()
    data["llama_cpp_python"] = L.__version__
    data.update(gpu_facts())
    if args.facts:
        data.update(json.loads(args.facts.read_text()))
    write_json(args.json, data)


def int_list(text: str) -> list[int]:
    """'1-4,8' -> [1, 2, 3, 4, 8]"""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1-16,24,32 (got '{text}')") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"counts must be positive (got '{text}')")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write a random-weight F16 GGUF of a named shape")
    mk.add_argument("--shape", choices=sorted(SHAPES), required=True)
    mk.add_argument("--out", type=Path, required=True)
    mk.add_argument("--q4_0", type=Path, help="also quantize it to Q4_0 here")
    mk.add_argument("--threads", type=int, default=os.cpu_count())
    qu = sub.add_parser("quantize", help="quantize a GGUF through llama_model_quantize")
    qu.add_argument("--type", choices=sorted(FTYPES), default="q4_0")
    qu.add_argument("--src", type=Path, required=True)
    qu.add_argument("--dst", type=Path, required=True)
    qu.add_argument("--threads", type=int, default=os.cpu_count())
    me = sub.add_parser("measure", help="time decodes of a GGUF, merge the result into --json")
    me.add_argument("--model", type=Path, required=True)
    me.add_argument("--label", help="the entry's name in the JSON (default: the file's stem)")
    me.add_argument("--rows", type=int_list, default=int_list("1-16,24,32,48,64,96,128"))
    me.add_argument("--flash-attn", type=lambda s: s.split(","), default=["on", "off"])
    me.add_argument("--seqs", type=int_list, default=int_list("1,2,4,8,16"))
    me.add_argument("--seq-rows", type=int_list, default=int_list("1,5,9"))
    me.add_argument("--depths", type=int_list, default=int_list("1024,4096"))
    me.add_argument("--depth-rows", type=int_list, default=int_list("1,8"))
    me.add_argument("--prefix", type=int, default=128, help="context depth of the verify and multi-seq rows")
    me.add_argument("--reps", type=int, default=15)
    me.add_argument("--gpu-layers", type=int, default=999)
    me.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 8))
    me.add_argument("--json", type=Path, required=True)
    me.add_argument("--native-log", action="store_true", help="log through llama.cpp's stderr logger")
    me.add_argument("--facts", type=Path, help="a JSON object of machine/build facts to merge in")
    args = ap.parse_args(argv)
    if args.cmd == "make":
        t0 = time.perf_counter()
        make_model(args.shape, args.out)
        print(f"{args.out}: {args.out.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.q4_0:
            secs = quantize(args.out, args.q4_0, args.threads)
            print(f"{args.q4_0}: {args.q4_0.stat().st_size / 2**20:.0f} MiB in {secs:.1f} s", flush=True)
        return
    if args.cmd == "quantize":
        secs = quantize(args.src, args.dst, args.threads, args.type)
        print(f"{args.dst}: {args.dst.stat().st_size / 2**20:.0f} MiB in {secs:.1f} s", flush=True)
        return
    if any(f not in ("on", "off") for f in args.flash_attn):
        ap.error("--flash-attn takes on, off or on,off")
    if max(args.rows) > 512 or max(args.seqs) > 16 or max(args.seqs) * max(args.seq_rows) > 512:
        ap.error("at most 512 rows per decode and 16 sequences")
    args.label = args.label or args.model.stem
    cmd_measure(args)


if __name__ == "__main__":
    sys.exit(main())
