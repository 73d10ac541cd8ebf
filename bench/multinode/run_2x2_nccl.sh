#!/bin/bash
# A converted fixture as 2 nodes x 2 GPUs on one 4-GPU host: two torchrun agents, c10d on
# 127.0.0.1, NCCL. Usage (repo root): bash bench/multinode/run_2x2_nccl.sh OUTDIR
set -u
O=${1:-/tmp/mn_out}; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
R=$PWD; F=$R/fixtures/13_checkpoint_resume; W=/tmp/mn; rm -rf $W; mkdir -p $W/ev $W/node0 $W/node1; cp $F/expected.py $W/train.py
L=$O/two_nodes_2x2_nccl.log
{ echo "# converted fixture 13_checkpoint_resume (expected.py) as 2 nodes x 2 GPUs: two torchrun agents on one host, c10d on 127.0.0.1, NCCL"; echo "# command: bash bench/multinode/run_2x2_nccl.sh"; date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__,"cuda",torch.version.cuda,"gpus",torch.cuda.device_count())'; echo "args: $(cat $F/args.txt 2>/dev/null)"; } > $L
(while sleep 0.5; do nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader; done > $W/apps.txt 2>&1) & MON=$!
P=""
for i in 0 1; do
G=$([ $i = 0 ] && echo 0,1 || echo 2,3)
(cd $W/node$i && CUDA_VISIBLE_DEVICES=$G DDPIFY_NODE=$i DDPIFY_EVIDENCE_DIR=$W/ev PYTHONPATH=$R/tests/multinode_cases timeout 300 torchrun --nnodes=2 --nproc_per_node=2 --node-rank=$i --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29512 --rdzv-id=gpu2x2 ../train.py $(cat $F/args.txt 2>/dev/null) > $W/agent$i.log 2>&1; echo "agent $i (CUDA_VISIBLE_DEVICES=$G) exit $?" | tee -a $W/agent$i.log >> $L) &
P="$P $!"
done
wait $P; kill $MON
{ echo "--- GPU processes seen by nvidia-smi during the run (pid, bus id, memory)"; sort -u $W/apps.txt; echo "--- files on each node's disk"; ls $W/node0 $W/node1; echo "--- NCCL rank -> device"; grep -h "cudaDev" $W/agent*.log | sed 's/^.*NCCL INFO //' | sort -u; echo "--- per-process evidence (tests/multinode_cases/sitecustomize.py)"; python3 -c "import sys,pathlib;sys.path.insert(0,'$R/tests/multinode_cases');import harness as h;r=h.load_evidence(pathlib.Path('$W/ev'));print(h.summary(r));print('check_evidence problems:',h.check_evidence(r,4,2,backend='nccl'))"; echo "--- agent logs"; tail -n 30 $W/agent0.log $W/agent1.log; } >> $L 2>&1
