"""Own µs per cycle by function of one bench/host_time.py mode (cProfile on the thread's CPU clock, the
llama.cpp compute calls left out), one chat and one copy prompt, each run once unprofiled first:

    python bench/host_profile.py eagle-chain 128 out.json   # PYTHONPATH=<other checkout> for a before/after
"""
import cProfile, json, pstats, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_time as H
from localspec.formats.chat_format import Message
from localspec.runtime.bench import load_prompts
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.store.models import resolve

mode, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = resolve(None)
prompts = [p for path in (H.BENCH / "chat.jsonl", H.BENCH / "copy.jsonl") for p in load_prompts(path)[:1]]
clock = H.NativeClock().install()
prof = cProfile.Profile(time.thread_time)
cycles = 0
with Engine(spec.target, spec.drafter, n_threads=2, n_ctx=4096) as engine:
    engine.cost_model()
    for bp in prompts:
        messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
        engine.clear_cache()
        H.one(engine, clock, messages, GenerationConfig(max_tokens=n, **H.CONFIGS[mode]))   # warm
        engine.clear_cache()
        r = H.one(engine, clock, messages, GenerationConfig(max_tokens=n, **H.CONFIGS[mode]), prof)
        cycles += r["cycles"]
st = pstats.Stats(prof)
rows = []
for (f, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
    if name == "timed":
        continue
    rows.append((tt / cycles * 1e6, nc / cycles, f"{f.split('/localspec/')[-1].split('/site-packages/')[-1]}:{name}"))
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
json.dump({"mode": mode, "cycles": cycles, "total_us": total, "rows": rows[:60]}, open(out, "w"), indent=0)
print(mode, "cycles", cycles, "python own µs/cycle total", round(total, 1))
for us, calls, name in rows[:25]:
    print(f"{us:8.1f} {calls:6.2f}  {name}")
