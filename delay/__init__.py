"""delay package."""
