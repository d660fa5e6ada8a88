"""What operators and tools read: ``/health`` (liveness and per-model readiness), ``/metrics``,
``/admin/*`` (``admin``), ``/admin/overview`` (``overview``, behind the status page and
``mlxd ps``), the status page at ``/`` (``status_page``, ``static/``) and ``/openapi.json``."""
