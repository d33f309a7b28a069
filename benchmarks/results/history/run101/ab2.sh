#!/bin/bash
# Run 101: BERT warm starts of run 100's two caches (kernel time); ResNet-18 and the transformer, old vs new code, quiet CPU.
python -c "import ray" 2>/dev/null || { bash .wheelhouse/install > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }; }
export TORCHINDUCTOR_COMPILE_THREADS=16
REPO=$PWD; OLD=$PWD/.devrun/old
R=/root/r101; mkdir -p $R/logs
ls /root/ab > $R/ab_files.txt
for v in old new; do
  if [ $v = old ]; then P=$OLD; else P=$REPO; fi
  echo "$(date -u +%T) bert $v warm" >> $R/run.log
  (cd /root && PYTHONPATH=$P timeout 100 python $P/benchmarks/compile_time.py --models /root/stub/bert_infer.py --scenarios warm-start --cache sqlite:////root/ab/$v.db --kernel-profile --runs 30 --out $R/bert_${v}_warm --log-dir $R/logs/bert_$v >> $R/run.log 2>&1)
done
for m in resnet gpt; do
  for v in old new; do
    if [ $v = old ]; then P=$OLD; else P=$REPO; fi
    echo "$(date -u +%T) $m $v sweep+warm" >> $R/run.log
    (cd /root && PYTHONPATH=$P timeout 150 python $P/benchmarks/compile_time.py --models $m --scenarios sweep,warm-start --cache sqlite:///$R/${m}_$v.db --kernel-profile --runs 30 --out $R/${m}_$v --log-dir $R/logs/${m}_$v >> $R/run.log 2>&1)
    cd $R && tar czf $OUT/r101.tgz --exclude='*.db' . ; cd $REPO
  done
done
echo "$(date -u +%T) done" >> $R/run.log
cd $R && tar czf $OUT/r101.tgz . 
