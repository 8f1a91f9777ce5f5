"""lit_lowrank."""
