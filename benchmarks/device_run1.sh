#!/usr/bin/env bash
# GPU session, run 1: environment, GPU tests, throughput, sanitizer fixtures. Outputs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HYPOTHESIS_PROFILE=ci
L=$OUT/logs; mkdir -p $L
{ nvidia-smi; python3 -c "import torch,triton,hypothesis;print(torch.__version__,triton.__version__,hypothesis.__version__)";
  which compute-sanitizer; compute-sanitizer --version; compute-sanitizer --help; } > $L/env.txt 2>&1
timeout 200 python3 -m pytest -m gpu --kvfence-device cuda -q -p no:cacheprovider -x > $L/pytest_gpu.txt 2>&1; echo "pytest_gpu rc=$?" >> $L/rc.txt
timeout 150 python3 benchmarks/throughput.py --json $L/h200.json > $L/throughput.txt 2>&1; echo "throughput rc=$?" >> $L/rc.txt
F=tests/fixtures/make_sanitizer_fixtures.py
CS="compute-sanitizer --error-exitcode 86 --print-limit 0 --kernel-name kns=generate_draft_decode_kv_indices"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 $CS --tool memcheck --padding 64 --xml --save $L/memcheck_nocache.xml python3 $F --sizing prefix > $L/memcheck_nocache_xmlrun.txt 2>&1; echo "mc_nocache_xml rc=$?" >> $L/rc.txt
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 $CS --tool memcheck --padding 64 python3 $F --sizing prefix > $L/memcheck_nocache.txt 2>&1; echo "mc_nocache_txt rc=$?" >> $L/rc.txt
timeout 60 $CS --tool memcheck --xml --save $L/memcheck_cache.xml python3 $F --sizing prefix > $L/memcheck_cache_xmlrun.txt 2>&1; echo "mc_cache rc=$?" >> $L/rc.txt
timeout 60 $CS --tool memcheck python3 $F --sizing prefix > $L/memcheck_cache.txt 2>&1; echo "mc_cache_txt rc=$?" >> $L/rc.txt
for t in initcheck racecheck synccheck; do
  timeout 60 $CS --tool $t --xml --save $L/${t}_safe.xml python3 $F --sizing safe > $L/${t}_safe_run.txt 2>&1; echo "$t rc=$?" >> $L/rc.txt
done
timeout 60 $CS --tool initcheck python3 $F --sizing safe > $L/initcheck_safe.txt 2>&1
cp $L/h200.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs; rm -rf $L
cat $OUT/../rc.txt 2>/dev/null; tar xzf $OUT/logs.tgz -O logs/rc.txt; tail -3 $OUT/../x 2>/dev/null; true
