"""Adapter injectors: PEFT-compatible LoRA variants and the AdapterInjector callback (see DESIGN.md)."""

from lit_lowrank.adapters.diagnostics import AdapterDiagnostics
from lit_lowrank.adapters.injector import (
    AdapterInjector,
    adapter_layers,
    adapter_method,
    inject_adapters,
    load_adapters,
    load_peft_model,
    merge_adapters,
    named_adapter_layers,
    peft_config_for,
    read_variant_info,
    save_adapters,
    write_variant_info,
)
from lit_lowrank.adapters.polar import PoLARLandingWarning, PoLARLinear, polar_delta_stable_rank, polar_layers
from lit_lowrank.adapters.polar_landing import PoLARLanding, apply_landing_, polar_diagnostics, stiefel_factors
from lit_lowrank.adapters.polar_vbll import AlternatingSchedule, PoLARVBLL, apply_polar_vbll
from lit_lowrank.adapters.sama import SaMALinear
from lit_lowrank.adapters.sd_lora import SDLoRA
from lit_lowrank.adapters.sds_lora import SDSLoraLinear
from lit_lowrank.adapters.variants import available_variants, get_variant, register_variant, unregister_variant

__all__ = [
    "PoLARLanding", "PoLARLinear", "apply_landing_", "polar_delta_stable_rank", "polar_diagnostics", "polar_layers",
    "stiefel_factors", "PoLARLandingWarning",
    "AlternatingSchedule", "PoLARVBLL", "apply_polar_vbll",
    "AdapterDiagnostics", "AdapterInjector", "SaMALinear", "SDLoRA", "SDSLoraLinear", "adapter_layers", "adapter_method",
    "available_variants", "get_variant", "inject_adapters",
    "load_adapters", "load_peft_model", "merge_adapters", "named_adapter_layers", "peft_config_for",
    "read_variant_info", "register_variant", "save_adapters", "unregister_variant", "write_variant_info",
]
