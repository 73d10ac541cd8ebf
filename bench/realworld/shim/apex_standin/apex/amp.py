"""apex.amp stand-in: no mixed precision on the CPU, the same call shapes as apex."""

import contextlib


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0 ** 24):
    """apex returns (models, optimizers) in the shape given (a list stays a list)."""
    if optimizers is None:
        return models
    return models, optimizers


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    yield loss


def master_params(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None):
    return {} if destination is None else destination


def load_state_dict(state_dict):
    return None


def _identity_decorator(fn=None, *a, **k):
    return fn


half_function = float_function = promote_function = _identity_decorator


def register_half_function(module, name):
    pass


register_float_function = register_promote_function = register_half_function


@contextlib.contextmanager
def disable_casts():
    yield
