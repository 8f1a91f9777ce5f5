"""Methods that act from outside a module (one file each)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # static analysers and IDEs see the real names
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

_EXPORTS = {
    'CastorDiagnostics': 'lit_lowrank.callbacks.castor',
    'MoEQuantQAT': 'lit_lowrank.callbacks.moe_quant',
    'RoutingReplay': 'lit_lowrank.callbacks.moe_quant',
    'SafeCut': 'lit_lowrank.callbacks.safecut',
    'SARA': 'lit_lowrank.callbacks.sara',
    'SARAController': 'lit_lowrank.callbacks.sara_controller',
    'apply_sara': 'lit_lowrank.callbacks.sara_controller',
    'SHOT': 'lit_lowrank.callbacks.shot',
    'StableRankMonitor': 'lit_lowrank.callbacks.stable_rank',
    'STACR': 'lit_lowrank.callbacks.stac_r',
    'STACRLinear': 'lit_lowrank.callbacks.stac_r',
    'apply_checkpointing': 'lit_lowrank.callbacks.stac_r',
    'apply_stac_r': 'lit_lowrank.callbacks.stac_r',
    'galore_param_groups': 'lit_lowrank.callbacks.stac_r',
    'SublayerDrop': 'lit_lowrank.callbacks.sublayer_drop',
    'MethodCallback': 'lit_lowrank.core.loss_hooks',
}

__all__ = ["MoEQuantQAT", "RoutingReplay"]
__all__ += ["CastorDiagnostics", "MethodCallback", "SARA", "SARAController", "SHOT", "SafeCut", "apply_sara", "STACR",
           "STACRLinear", "apply_stac_r", "apply_checkpointing", "galore_param_groups",
           "StableRankMonitor",
           "SublayerDrop"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
