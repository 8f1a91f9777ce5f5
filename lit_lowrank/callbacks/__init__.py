"""Methods that act from outside a module (one file each)."""

from lit_lowrank.callbacks.castor import CastorDiagnostics
from lit_lowrank.callbacks.moe_quant import MoEQuantQAT, RoutingReplay
from lit_lowrank.callbacks.safecut import SafeCut
from lit_lowrank.callbacks.sara import SARA
from lit_lowrank.callbacks.sara_controller import SARAController, apply_sara
from lit_lowrank.callbacks.shot import SHOT
from lit_lowrank.callbacks.stable_rank import StableRankMonitor
from lit_lowrank.callbacks.stac_r import STACR, STACRLinear, apply_checkpointing, apply_stac_r, galore_param_groups
from lit_lowrank.callbacks.sublayer_drop import SublayerDrop
from lit_lowrank.core.loss_hooks import MethodCallback

__all__ = ["MoEQuantQAT", "RoutingReplay"]
__all__ += ["CastorDiagnostics", "MethodCallback", "SARA", "SARAController", "SHOT", "SafeCut", "apply_sara", "STACR",
           "STACRLinear", "apply_stac_r", "apply_checkpointing", "galore_param_groups",
           "StableRankMonitor",
           "SublayerDrop"]
