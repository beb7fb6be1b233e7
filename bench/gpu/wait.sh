#!/bin/bash
# One `run` call: start the pipeline unless this machine already runs it, wait up to $1 seconds
# for it, then bring results and logs back under $OUT.
G=$PWD/.gpu; W=/tmp/w; LIMIT=${1:-540}
if [ ! -e $W/pipeline.log ]; then mkdir -p $W; setsid nohup bash $G/pipeline.sh $G </dev/null >/dev/null 2>&1 & sleep 2; fi
t0=$(date +%s)
while [ ! -e $W/DONE ] && [ $(( $(date +%s) - t0 )) -lt $LIMIT ]; do sleep 5; done
cp $W/out/* $OUT/ 2>/dev/null
tail -c 2000000 $W/build.log >$W/build.tail.log 2>/dev/null
tar czf $OUT/logs.tgz -C $W pipeline.log make.log measure.log probe.log build.tail.log 2>/dev/null
echo "=== done: $( [ -e $W/DONE ] && echo yes || echo NO, still running )"
grep -v '^\[' $W/pipeline.log | tail -40
tail -5 $W/build.log
grep "fa=" $W/measure.log 2>/dev/null; grep -h "fa=" $W/pipeline.log | tail
