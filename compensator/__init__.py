"""compensator package."""
