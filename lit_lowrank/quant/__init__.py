"""quant: see DESIGN.md (filled by the method issues)."""
