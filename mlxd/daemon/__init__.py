"""The daemon's runtime: what `mlxd start` runs once the CLI has built a ``ServeConfig``.

Supervision of the worker processes (spawn, heartbeat, restart, lazy load under the memory
budget, attach), the HTTP and admin-socket servers, and the files a detached daemon keeps in the
data dir. Imports go one way: ``cli -> daemon -> gateway|worker|protocol``; nothing here sees
click or imports ``cli``.
"""
