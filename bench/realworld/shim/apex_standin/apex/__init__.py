"""CPU stand-in for NVIDIA apex, for the real-world corpus harness only (never part of ddpify).

The corpus has single-GPU scripts that import apex (amp.initialize / amp.scale_loss, FusedAdam,
convert_syncbn_model). apex is a CUDA extension that is not installed on the CPU machine, so the
originals and the converted outputs could not even start there. shim/sitecustomize.py puts this
package LAST on the import path, so a real apex (the GPU machine's) always wins. What it does:
amp.initialize returns its inputs (fp32 on the CPU), amp.scale_loss yields the loss unscaled,
FusedAdam/FusedLAMB/FusedSGD are torch.optim optimizers with the same update rule where torch has
one (FusedLAMB: AdamW, a stand-in only), convert_syncbn_model is the identity. The CPU runs
therefore check the control flow and the conversion, not mixed precision; the GPU run uses apex.
"""

from . import amp, fp16_utils, optimizers, parallel  # noqa: F401

__version__ = "0.0+rw-cpu-standin"
