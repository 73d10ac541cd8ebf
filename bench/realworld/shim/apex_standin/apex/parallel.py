"""apex.parallel stand-in: SyncBN conversion is the identity (one process: BatchNorm is exact)."""

import torch


def convert_syncbn_model(module, process_group=None, channel_last=False):
    return module


SyncBatchNorm = torch.nn.SyncBatchNorm


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, message_size=10000000, delay_allreduce=False, shared_param=None,
                 allreduce_trigger_params=None, retain_allreduce_buffers=False, allreduce_always_fp32=False,
                 num_allreduce_streams=1, allreduce_communicators=None, gradient_average=True,
                 gradient_predivide_factor=1.0, gradient_average_split_factor=None, prof=False):
        super().__init__(module)
