from __future__ import annotations

from mlxd.cli.main import main

main()
