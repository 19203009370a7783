"""The local state directory: secret key, ledgers, locks (see docs/state.md)."""
