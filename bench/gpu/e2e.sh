#!/bin/bash
# The embedded default pair (SmolLM2-135M Q4_0 + its EAGLE-3 drafter) end to end on CUDA, in one
# device run of under 9 minutes, building included. Run from the repository root on the device:
#     bash bench/gpu/e2e.sh [G] [LIMIT]
# G (default .gpu, filled here by `bash bench/gpu/prepare.sh .gpu --e2e`): the trimmed sdist, the
# wheels the image lacks, the embedded target's wheel. LIMIT: seconds for the whole job (default 520).
#
# ONE CUDA build of the pinned llama.cpp (cmake + ninja, the sdist's vendor/llama.cpp) gives the
# shared libraries llama-cpp-python loads (LLAMA_CPP_LIB_PATH: no second build through pip) and the
# native tools, llama-speculative-simple and llama-server. Then, each step under its own timeout so
# that a slow one cannot eat the next one's time, results under $OUT (or ./gpu-e2e-out):
#   host_time.json  bench/host_time.py: host µs per cycle of every source, 1 and 4 slots, beside
#                   llama-speculative-simple's own loop (plain, ngram-mod)
#   peer.json       bench/peer_llamacpp.py: localspec plain / auto / chain (EAGLE) / tree against
#                   native plain and ngram-mod, same prompts, greedy, 128 tokens
#   serve.json      bench/serve_load.py: localspec serve vs llama-server (plain and ngram-mod) at
#                   C = 1, 4, 16 (16 slots)
#   gpu_e2e.md      bench/gpu/e2e_report.py: the tables for docs/gpu.md
# DRY=1 runs the same steps on a CPU with an existing CPU build (BUILD=dir with bin/), tiny sizes:
# a check of the script and the scripts it calls, not a measurement.
set -u
G=${1:-.gpu}; LIMIT=${2:-520}; REPO=$PWD; OUT=${OUT:-$REPO/gpu-e2e-out}; mkdir -p "$OUT"
W=${W:-/tmp/e2e}; mkdir -p "$W"
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
step() {   # step NAME SECONDS CMD...: run CMD under min(SECONDS, time left - 10) seconds, log it
  local name=$1 want=$2; shift 2
  local t=$(( $(left) - 10 )); [ "$t" -gt "$want" ] && t=$want
  if [ "$t" -lt 20 ]; then echo "skip $name: $(left) s left" | tee -a "$OUT/steps.log"; return 1; fi
  local s=$(date +%s)
  timeout --kill-after=5 "$t" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - s )) limit=$t" | tee -a "$OUT/steps.log"
  return $rc
}
exec 3>&1
{
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc; python3 -V
# -- one build -----------------------------------------------------------------------------------
if [ "${DRY:-0}" = 1 ]; then
  BUILD=${BUILD:?DRY=1 needs BUILD, a CPU build of the pinned llama.cpp}; NGL=0; THREADS=2; N=16; LIM=1; C=1,2; PAR=2
  SDIST=${SDIST:-/work/sdist/llama_cpp_python-0.3.36}
else
  SDIST=$W/llama_cpp_python-0.3.36; BUILD=$W/build; NGL=99; THREADS=8; N=128; LIM=3; C=1,4,16; PAR=16
  [ -d "$SDIST" ] || tar xzf "$G/llama_cpp_python-0.3.36-trim.tar.gz" -C "$W"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl
  # localspec's own llama_ext needs nothing more than libllama; the multimodal library is not built
  step cmake 60 cmake -S "$SDIST/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON
  step build 420 cmake --build "$BUILD" -j 16 --target llama llama-speculative-simple llama-server
fi
ls "$BUILD/bin" | head -30
export LLAMA_CPP_LIB_PATH=$BUILD/bin          # llama-cpp-python loads this build's libllama.so
export PYTHONPATH=$SDIST:/tmp/site:$SDIST/vendor/llama.cpp/gguf-py:$REPO PYTHONUNBUFFERED=1
export LOCALSPEC_HOME=$W/home; mkdir -p "$LOCALSPEC_HOME"
GXX_STD=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null)   # docs/gpu.md: the image's model-load crash
[ -f "$GXX_STD" ] && [ "${DRY:-0}" != 1 ] && export LD_PRELOAD=$GXX_STD
# the native tools where bench/peer_llamacpp.build_tool looks for them (no second build)
V=$(python3 -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))" 2>/dev/null || echo 0.3.36)
PEER=$W/peer; mkdir -p "$PEER/llama.cpp-$V"; ln -sfn "$BUILD" "$PEER/llama.cpp-$V/build"
python3 -c "import llama_cpp, localspec; print('llama_cpp', llama_cpp.__version__, llama_cpp.llama_supports_gpu_offload())"
# the Q4_0 target derived once (not timed), the calibration taken once (as a user's first run)
step warm 90 python3 -m localspec generate -p "Hello" -n 8 --gpu-layers $NGL --threads $THREADS
cd "$REPO/bench"
step host_time 90 python3 host_time.py --threads $THREADS -n $N --limit $LIM --gpu-layers $NGL --native \
    --tool "$BUILD/bin/llama-speculative-simple" --json "$OUT/host_time.json"
step peer 120 python3 peer_llamacpp.py -n $N --threads $THREADS --limit $LIM --gpu-layers $NGL \
    --native plain,ngram-mod --modes plain,auto,chain,tree --cache "$PEER" --json "$OUT/peer.json"
step serve 150 python3 serve_load.py --parallel $PAR --concurrency $C -n $N --threads $THREADS --gpu-layers $NGL \
    --servers localspec,localspec-plain,llama-server,llama-server-ngram-mod --cache "$PEER" --json "$OUT/serve.json"
cd "$REPO"
python3 bench/gpu/e2e_report.py "$OUT" >"$OUT/gpu_e2e.md" 2>>"$OUT/steps.log"
date -u; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee "$OUT/e2e.log" >&3
