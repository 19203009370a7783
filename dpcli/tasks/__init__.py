"""The papers' algorithms as importable tasks (no CLI code)."""
