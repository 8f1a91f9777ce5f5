"""mixins: methods that change a module's structure as part of its own forward (DESIGN.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.mixins.specdrop import (  # noqa: F401
        SpecDropBranches,
        apply_specdrop,
        log_specdrop_diagnostics,
        specdrop_aux_loss,
        specdrop_blocks,
        specdrop_category,
    )
    from lit_lowrank.mixins.specdrop_analysis import SpecDropSensitivity, ablate_branch  # noqa: F401

_EXPORTS = {
    'SpecDropBranches': 'lit_lowrank.mixins.specdrop',
    'ablate_branch': 'lit_lowrank.mixins.specdrop_analysis',
    'apply_specdrop': 'lit_lowrank.mixins.specdrop',
    'log_specdrop_diagnostics': 'lit_lowrank.mixins.specdrop',
    'specdrop_aux_loss': 'lit_lowrank.mixins.specdrop',
    'specdrop_blocks': 'lit_lowrank.mixins.specdrop',
    'specdrop_category': 'lit_lowrank.mixins.specdrop',
    'SpecDropSensitivity': 'lit_lowrank.mixins.specdrop_analysis',
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
