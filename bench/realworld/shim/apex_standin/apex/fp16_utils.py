"""apex.fp16_utils stand-in: FP16_Optimizer without loss scaling (fp32 on the CPU)."""


class FP16_Optimizer:
    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
                 dynamic_loss_args=None, verbose=True):
        self.optimizer = init_optimizer

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        loss.backward(retain_graph=retain_graph)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    def state_dict(self):
        return {"optimizer_state_dict": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])


def clip_grad_norm(parameters, max_norm, norm_type=2):
    import torch

    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)


def to_python_float(t):
    return t.item() if hasattr(t, "item") else t[0]
