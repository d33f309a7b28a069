#!/bin/bash
# Run 100: kernel-bound timer cost/accuracy, and BERT's pass under CPU load, old vs new code.
bash .wheelhouse/install > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
export TORCHINDUCTOR_COMPILE_THREADS=16
REPO=$PWD; OLD=$PWD/.devrun/old
mkdir -p /root/stub /root/ab $OUT/logs
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/smi.txt; nproc >> $OUT/smi.txt
timeout 90 python benchmarks/diag_timing_load.py --out $OUT > $OUT/diag_timing.log 2>&1; echo "diag rc=$?" >> $OUT/diag_timing.log
python benchmarks/zoo/__init__.py stub bert infer /root/stub
hogs() { for i in $(seq $(nproc)); do python3 -c 'while True: pass' & done; }
hogs; sleep 1
echo "$(date -u +%T) old sweep (busy CPU)" >> $OUT/ab.log
(cd /root && PYTHONPATH=$OLD timeout 200 python $OLD/benchmarks/compile_time.py --models /root/stub/bert_infer.py --scenarios sweep --cache sqlite:////root/ab/old.db --out $OUT/old_sweep --log-dir $OUT/logs/old >> $OUT/ab.log 2>&1)
echo "$(date -u +%T) new sweep (busy CPU)" >> $OUT/ab.log
timeout 200 python benchmarks/compile_time.py --models /root/stub/bert_infer.py --scenarios sweep --cache sqlite:////root/ab/new.db --out $OUT/new_sweep --log-dir $OUT/logs/new >> $OUT/ab.log 2>&1
pkill -f 'while True: pass'; sleep 1
for v in old new; do
  echo "$(date -u +%T) $v warm (quiet CPU)" >> $OUT/ab.log
  if [ $v = old ]; then P=$OLD; else P=$REPO; fi
  (cd /root && PYTHONPATH=$P timeout 100 python $P/benchmarks/compile_time.py --models /root/stub/bert_infer.py --scenarios warm-start --cache sqlite:////root/ab/$v.db --kernel-profile --runs 30 --out $OUT/${v}_warm --log-dir $OUT/logs/$v >> $OUT/ab.log 2>&1)
done
cp /root/ab/*.db $OUT/ 2>/dev/null
cd $OUT/logs && tar czf $OUT/logs.tgz . && cd $OUT && rm -rf $OUT/logs
echo "$(date -u +%T) done" >> $OUT/ab.log
