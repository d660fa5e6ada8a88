"""The `mlxd` command line: options become config values; nothing below here sees click."""
