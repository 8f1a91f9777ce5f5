"""mixins: methods that change a module's structure as part of its own forward (DESIGN.md)."""

from lit_lowrank.mixins.specdrop import (
    SpecDropBranches,
    ablate_branch,
    apply_specdrop,
    log_specdrop_diagnostics,
    specdrop_aux_loss,
    specdrop_blocks,
    specdrop_category,
)
from lit_lowrank.mixins.specdrop_analysis import SpecDropSensitivity

__all__ = [
    "SpecDropBranches", "SpecDropSensitivity", "ablate_branch", "apply_specdrop", "log_specdrop_diagnostics",
    "specdrop_aux_loss", "specdrop_blocks", "specdrop_category",
]
