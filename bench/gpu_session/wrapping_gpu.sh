#!/bin/bash
# The DDP wrap follows the model's own device (no device_ids, a "cpu:gloo,cuda:nccl" group) and a
# model run twice before one backward gets broadcast_buffers=False (DDP136). On 2 GPUs:
#  1. torch facts the change relies on (mixed.py): DDP of a CPU module and of a CUDA module with no
#     device_ids in a cpu:gloo,cuda:nccl group with device_id; barrier, CPU and CUDA all_reduce,
#     the DECISION broadcast; GradScaler("cuda") enabled over a CPU model's loss; a BatchNorm
#     model run twice before one backward, with broadcast_buffers=False (must pass) and without
#     (fails before torch 2.13: reported, not a failure).
#  2. fixture outputs 170-173, 20, 21 under torchrun (2 ranks) and as plain python, with the
#     device flags on and off (170 --cuda, 171 --device cuda).
#  3. with .realworld_export/: the corpus entries this change fixed, through realworld_gpu.sh.
# Usage (repo root, 2 GPUs): bash bench/gpu_session/wrapping_gpu.sh OUTDIR
set -u
O=${1:-/tmp/wrapping_gpu}; mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; git rev-parse HEAD; python3 -c 'import torch;print("torch",torch.__version__,"cuda",torch.cuda.device_count())'; } > "$O/machine.txt" 2>&1
cat > "$O/mixed.py" <<'PY'
import os, sys, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
dist.init_process_group("cpu:gloo,cuda:nccl", device_id=dev)
ok = True
def check(name, fn):
    global ok
    try:
        fn(); print(f"rank{rank} PASS {name}")
    except Exception as e:
        ok = False; print(f"rank{rank} FAIL {name}: {type(e).__name__}: {str(e)[:300]}")
def step(where):
    torch.manual_seed(0)
    m = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(where))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad(); m(torch.randn(16, 4, device=where) + rank).pow(2).mean().backward(); opt.step()
    w = m.module[0].weight.detach().to(dev).clone(); ws = [torch.empty_like(w) for _ in range(2)]
    dist.all_gather(ws, w); assert torch.equal(ws[0], ws[1]), "parameters differ between ranks"
check("DDP of a CPU module, no device_ids", lambda: step("cpu"))
check("DDP of a CUDA module, no device_ids", lambda: step(dev))
check("barrier", lambda: dist.barrier())
def reduce(where):
    t = torch.ones(3, device=where); dist.all_reduce(t); assert t.sum().item() == 6, t
check("all_reduce of a CPU tensor (gloo)", lambda: reduce("cpu"))
check("all_reduce of a CUDA tensor (NCCL)", lambda: reduce(dev))
def decision():
    d = torch.zeros(1, dtype=torch.long, device=dev); d.fill_(rank == 0); dist.broadcast(d, src=0); assert d.item() == 1
check("DECISION broadcast", decision)
def scaler_cpu_model():
    s = torch.amp.GradScaler("cuda", enabled=True)
    m = DDP(nn.Linear(4, 1)); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = m(torch.randn(8, 4)).pow(2).mean()
    s.scale(loss).backward(); s.unscale_(opt); s.step(opt); s.update()
check("GradScaler('cuda') over a CPU model (fp16 GPUs)", scaler_cpu_model)
def twice(**kw):
    d = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(dev), **kw)
    (d(torch.randn(16, 4, device=dev)).mean() + d(torch.randn(16, 4, device=dev)).mean()).backward()
check("BatchNorm model run twice before one backward, broadcast_buffers=False", lambda: twice(broadcast_buffers=False))
try:
    twice(); print(f"rank{rank} INFO the same with buffers broadcast passes on torch {torch.__version__}")
except RuntimeError as e:
    print(f"rank{rank} INFO the same with buffers broadcast fails on torch {torch.__version__} (expected before 2.13): {str(e)[:120]}")
dist.destroy_process_group()
sys.exit(0 if ok else 1)
PY
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$O/mixed.py" > "$O/mixed.log" 2>&1
grep -E "PASS|FAIL|INFO" "$O/mixed.log" | sort -u | tee "$O/summary.txt"
run() {  # name, fixture, then the script's arguments
  local name=$1 f=$2; shift 2
  local work; work=$(mktemp -d); cp "fixtures/$f/expected.py" "$work/"
  (cd "$work" && timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 expected.py "$@") > "$O/$name.torchrun.log" 2>&1; local rc=$?
  (cd "$work" && timeout 300 python3 expected.py "$@") > "$O/$name.python.log" 2>&1; local prc=$?
  if [ $rc -eq 0 ] && [ $prc -eq 0 ] && ! grep -q "terminate called" "$O/$name.torchrun.log"; then
    echo "PASS $name (torchrun rc=$rc, python rc=$prc)"
  else
    echo "FAIL $name (torchrun rc=$rc, python rc=$prc): $(grep -hE 'Error|error:' "$O/$name.torchrun.log" "$O/$name.python.log" | tail -1)"
  fi
  rm -rf "$work"
}
{
  run 170_flag_off 170_cuda_flag_off_whole_model_save
  run 170_flag_on 170_cuda_flag_off_whole_model_save --cuda
  run 171_cpu_default 171_device_flag_cpu_default
  run 171_device_cuda 171_device_flag_cpu_default --device cuda
  run 172_gan_bn 172_gan_batchnorm_real_fake
  run 173_gan_sync_bn 173_gan_trainer_loop_sync_bn
  run 20_gan 20_gan
  run 21_syncbn 21_bn_cnn_syncbn
} | tee -a "$O/summary.txt"
if [ -d .realworld_export ]; then
  ONLY=examples-dcgan,examples-mnist-rnn,examples-super-resolution,examples-word-lm,makemore,gan-acgan,gan-infogan,gan-dcgan,gan-pix2pix,examples-mnist,kuangliu-cifar \
    bash bench/gpu_session/realworld_gpu.sh "$O/realworld" 2>&1 | grep -E "^(PASS|FAIL)|passed," | tee -a "$O/summary.txt"
fi
