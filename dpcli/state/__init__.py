"""The local state directory: secret key, ledgers, locks (see README "State directory")."""
