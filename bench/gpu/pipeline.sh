#!/bin/bash
# The whole device job, run detached (setsid) so that it survives one `run` call and a second call
# can wait on it: unpack the trimmed sdist, build the CUDA wheel (random GGUFs written meanwhile),
# quantize, measure. $1: the folder holding the sdist tarball, whl/ and gpu_costs.py.
G=$1; W=/tmp/w; mkdir -p $W/out; cd $W
exec >$W/pipeline.log 2>&1
set -x
date -u; nvidia-smi; nproc; free -g; df -h /tmp; python3 -V; which python3 nvcc cmake ninja; nvcc --version | tail -2
tar xzf $G/llama_cpp_python-0.3.36-trim.tar.gz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $G/whl/*.whl
export PYTHONPATH=/tmp/site:$W/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py PYTHONUNBUFFERED=1
B="python3 $G/gpu_costs.py"
( $B make --shape smollm2-135m --out $W/s-f16.gguf && $B make --shape llama3-8b --out $W/l-f16.gguf &&
  $B make --shape drafter-8b --out $W/dl-f16.gguf && $B make --shape drafter-135m --out $W/ds-f16.gguf ) >$W/make.log 2>&1 &
MK=$!
t0=$(date +%s)
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=16
timeout 1500 python3 -m pip wheel -v --no-build-isolation --no-deps -w $W/wheel $W/llama_cpp_python-0.3.36 >$W/build.log 2>&1
rc=$?
echo "{\"build_rc\": $rc, \"build_seconds\": $(( $(date +%s) - t0 )), \"cmake_args\": \"$CMAKE_ARGS\", \"build_jobs\": 16}" >$W/build.json
cp $W/build.json $W/out/
ls -la $W/wheel
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/wheel/llama_cpp_python*.whl || { touch $W/DONE; exit 1; }
wait $MK
cat $W/make.log
$B quantize --src $W/s-f16.gguf --dst $W/s-q4_0.gguf >>$W/make.log 2>&1
$B quantize --src $W/l-f16.gguf --dst $W/l-q4_0.gguf >>$W/make.log 2>&1
$B quantize --type q4_k_m --src $W/l-f16.gguf --dst $W/l-q4_k_m.gguf >>$W/make.log 2>&1
grep -v '^\[' $W/make.log | grep -i "MiB in\|error" 
python3 -c "import json,sys;d=json.load(open('$W/build.json'));d['gpu_build']=sys.argv[1];json.dump(d,open('$W/facts.json','w'))" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) / $(nvcc --version | tail -1)"
# In the image's python3, llama_model_load_from_file segfaulted at its first std::stringstream
# (right after print_info's n_layer_all line) unless the system libstdc++ was preloaded (seen
# 2026-11-26, docs/gpu.md): probe ways of running on the small model, keep the first that works.
LIB=/tmp/site/llama_cpp/lib; ldd $LIB/libllama.so | grep -i "stdc\|gcc_s"; GXX_STD=$(g++ -print-file-name=libstdc++.so.6)
ls -la $GXX_STD /usr/lib/x86_64-linux-gnu/libstdc++.so.6*; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
strings /usr/lib/x86_64-linux-gnu/libstdc++.so.6 | grep "^GLIBCXX_3.4.3" | tail -1; strings $GXX_STD | grep "^GLIBCXX_3.4.3" | tail -1
probe() { timeout 120 env $1 python3 -X faulthandler $G/gpu_costs.py measure $2 --model $W/s-q4_0.gguf --label probe --rows 1,2 --seqs 1,2 --seq-rows 1 --depths 64 --depth-rows 1 --reps 2 --flash-attn on --json $W/probe.json >>$W/probe.log 2>&1; r=$?; echo "probe env=[$1] flags=[$2] rc=$r"; grep -A12 "Fatal Python\|Segmentation" $W/probe.log | tail -14; return $r; }
ENV=""; FLAGS=""; ok=0
for v in "LD_PRELOAD=$GXX_STD|--native-log" "LD_PRELOAD=$GXX_STD|" "X=1|--native-log" "X=1|"; do
  if probe "${v%%|*}" "${v#*|}"; then ENV=${v%%|*}; FLAGS=${v#*|}; ok=1; break; fi
done
if [ $ok = 0 ]; then
  timeout 150 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 $G/gpu_costs.py measure --native-log --model $W/s-q4_0.gguf --rows 1 --seqs 1 --depths 64 --reps 1 --flash-attn on --json $W/probe.json >$W/gdb.log 2>&1
  grep -A30 "SIGSEGV" $W/gdb.log | head -40; cp $W/gdb.log $W/out/
fi
python3 -c "import json;d=json.load(open('$W/facts.json'));d['run_env']='$ENV $FLAGS';json.dump(d,open('$W/facts.json','w'))"
MODELS=${MODELS:-"l-q4_0:llama3-8b/Q4_0 l-q4_k_m:llama3-8b/Q4_K_M dl-f16:drafter-8b/F16 ds-f16:drafter-135m/F16 s-q4_0:smollm2-135m/Q4_0 l-f16:llama3-8b/F16 s-f16:smollm2-135m/F16"}
for m in $MODELS; do
  [ $ok = 1 ] || break
  env $ENV python3 $G/gpu_costs.py measure $FLAGS --model $W/${m%%:*}.gguf --label ${m#*:} --threads 8 --json $W/gpu_costs.json --facts $W/facts.json 2>>$W/measure.log
  cp $W/gpu_costs.json $W/out/
done
date -u
touch $W/DONE
