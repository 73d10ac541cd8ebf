"""One module per concern. The pipeline runs them in PIPELINE order; launch runs last
because it emits the imports and set-up code the others asked for. A script distributed the
legacy way (apex, torch.distributed.launch) goes through LEGACY instead, the same way: the same
edits, the same last checks. OPTIMIZE holds the opt-in speed-ups of --optimize."""

from ddpify.transforms.accumulation import AccumulationTransform
from ddpify.transforms.apex import ApexTransform
from ddpify.transforms.batch_scale import BatchScaleTransform
from ddpify.transforms.batches import BatchesTransform
from ddpify.transforms.checkpoints import CheckpointTransform
from ddpify.transforms.dataprep import DataPrepTransform
from ddpify.transforms.decisions import DecisionTransform
from ddpify.transforms.device import DeviceTransform
from ddpify.transforms.input_pipeline import InputPipelineTransform
from ddpify.transforms.launch import LaunchTransform
from ddpify.transforms.legacy import LegacyLaunchTransform, LegacyTorchTransform
from ddpify.transforms.legacy_apex import ModerniseTransform
from ddpify.transforms.legacy_devices import LegacyDevicesTransform
from ddpify.transforms.optimize_cudnn import CudnnBenchmarkTransform
from ddpify.transforms.optimize_ddp import DDPBucketsTransform
from ddpify.transforms.optimize_layout import ChannelsLastTransform
from ddpify.transforms.optimize_loader import LoaderWorkersTransform
from ddpify.transforms.optimize_optimizer import FusedOptimizerTransform
from ddpify.transforms.optimize_static_graph import StaticGraphTransform
from ddpify.transforms.precision import PrecisionTransform
from ddpify.transforms.rank0 import Rank0Transform
from ddpify.transforms.sampler import SamplerTransform
from ddpify.transforms.seeds import SeedsTransform
from ddpify.transforms.wrapping import WrappingTransform

PIPELINE = (
    DeviceTransform,
    # --keep-global-batch / --scale-lr: decided before the data concerns, whose DDP026 note says
    # what became of the batch size (batch_note)
    BatchScaleTransform,
    BatchesTransform,
    SamplerTransform,
    InputPipelineTransform,
    WrappingTransform,
    ApexTransform,
    ModerniseTransform,
    PrecisionTransform,
    AccumulationTransform,
    CheckpointTransform,
    Rank0Transform,
    DataPrepTransform,
    DecisionTransform,
    SeedsTransform,
    LaunchTransform,
)
# A script distributed the legacy way (apex, torch.distributed.launch) keeps its own process
# group: these planners modernise it instead of a fresh conversion's.
LEGACY = (
    LegacyTorchTransform,
    ModerniseTransform,
    LegacyDevicesTransform,
    LegacyLaunchTransform,
)
# --optimize only: run after the others and before LaunchTransform (which emits the imports).
OPTIMIZE = (
    ChannelsLastTransform,
    CudnnBenchmarkTransform,
    FusedOptimizerTransform,
    DDPBucketsTransform,
    StaticGraphTransform,
    LoaderWorkersTransform,
)
