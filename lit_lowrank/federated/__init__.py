"""federated: see DESIGN.md (filled by the method issues)."""
