"""Methods that act from outside a module (one file each)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.callbacks.castor import CastorDiagnostics  # noqa: F401
    from lit_lowrank.callbacks.moe_quant import MoEQuantQAT, RoutingReplay  # noqa: F401
    from lit_lowrank.callbacks.safecut import SafeCut  # noqa: F401
    from lit_lowrank.callbacks.sara import SARA  # noqa: F401
    from lit_lowrank.callbacks.sara_controller import SARAController, apply_sara  # noqa: F401
    from lit_lowrank.callbacks.shot import SHOT  # noqa: F401
    from lit_lowrank.callbacks.stable_rank import StableRankMonitor  # noqa: F401
    from lit_lowrank.callbacks.stac_r import STACR, STACRLinear, apply_checkpointing, apply_stac_r, galore_param_groups  # noqa: F401
    from lit_lowrank.callbacks.sublayer_drop import SublayerDrop  # noqa: F401
    from lit_lowrank.core.loss_hooks import MethodCallback  # noqa: F401

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

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
