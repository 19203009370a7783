"""The command-line layer: parses options, calls library code, renders results."""
