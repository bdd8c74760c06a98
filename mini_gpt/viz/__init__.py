"""Pictures: attention maps and loss curves (matplotlib, Agg)."""
