"""apex.optimizers stand-in: torch.optim optimizers with apex's argument names."""

import torch


def FusedAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
              weight_decay=0.0, amsgrad=False, set_grad_none=True, capturable=False, master_weights=False):
    # apex's default adam_w_mode=True is decoupled weight decay: AdamW; False is Adam's L2 term
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def FusedLAMB(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
              amsgrad=False, adam_w_mode=True, grad_averaging=True, set_grad_none=True, max_grad_norm=1.0,
              use_nvlamb=False):
    # torch has no LAMB: AdamW stands in (control flow only; the GPU run uses apex)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def FusedSGD(params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
             wd_after_momentum=False, materialize_master_grads=True, set_grad_none=False):
    return torch.optim.SGD(params, lr=lr, momentum=momentum, dampening=dampening,
                           weight_decay=weight_decay, nesterov=nesterov)


FusedNovoGrad = FusedLAMB
