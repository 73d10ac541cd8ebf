"""ddpify: turn a single-GPU PyTorch training script into a DistributedDataParallel one."""

from ddpify.options import Options
from ddpify.pipeline import ConversionError, Result, convert_source

__all__ = ["ConversionError", "Options", "Result", "convert_source"]
__version__ = "0.1.0"
