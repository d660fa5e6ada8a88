"""An optimized BLAS for MLX's Linux CPU backend, loaded into the worker before MLX is.

The mlx-cpu wheel (0.32.4) links the netlib reference BLAS it vendors
(``mlx_cpu.libs/libblas-*.so.3.10.0``, needed by ``libmlx.so`` for ``cblas_sgemm``); MLX has no
runtime switch for it. A library loaded with ``RTLD_GLOBAL`` before ``mlx.core`` is imported
joins the global scope, which the dynamic linker searches before ``libmlx.so``'s own
dependencies, so MLX's ``cblas_sgemm`` becomes OpenBLAS's: 2.7 -> 100 GFLOP/s for a float32
512x512 product on our 2-core machine (docs/PERFORMANCE.md). Unlike ``LD_PRELOAD`` this leaks
into no child process and works for ``mlxd worker serve`` run by hand. Loaded after
``mlx.core``, it changes nothing (measured), so ``preload`` refuses then.

No MLX import here: this module runs before it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

ENV = "MLXD_BLAS"  # "off", or os.pathsep-separated directories / library files to try first
LIBRARY_NAMES = (
    "libopenblas.so.0",
    "libopenblasp.so.0",
    "libopenblas.so.3",
    "libopenblas.so",
    "libblis.so.4",
    "libblas.so.3",
)
# A generic libblas.so.3 counts only when it resolves to one of these (Debian alternatives).
_OPTIMIZED = ("openblas", "blis", "mkl")


def search_path(environ: Mapping[str, str]) -> list[Path]:
    """Where ``preload`` looks, in order: ``$MLXD_BLAS`` alone when set, else the system's
    library directories (none when ``MLXD_BLAS=off``)."""
    value = environ.get(ENV)
    if value is not None:
        off = value.strip().lower() in ("", "off", "none", "0")
        return [] if off else [Path(p) for p in value.split(os.pathsep) if p]
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [f"/usr/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return [Path(d) for d in dirs if d != "/usr/lib/"]


def find(environ: Mapping[str, str]) -> Path | None:
    """The first optimized BLAS library on ``search_path``, or None."""
    for entry in search_path(environ):
        if entry.is_file() and is_optimized(entry):
            return entry
        for name in LIBRARY_NAMES if entry.is_dir() else ():
            path = entry / name
            if path.exists() and is_optimized(path):
                return path
    return None


def is_optimized(path: Path) -> bool:
    """Whether ``path`` (after symlinks) is OpenBLAS, BLIS or MKL, not the reference BLAS."""
    real = str(path.resolve()).lower()
    return any(name in real for name in _OPTIMIZED)


def preload(environ: Mapping[str, str], platform: str = sys.platform) -> Path | None:
    """Load an optimized BLAS for MLX to use (Linux only; before ``mlx.core`` is imported).

    Returns the library now loaded, or None: not Linux, none found, ``MLXD_BLAS=off``, it
    failed to load, or MLX was imported already. The worker reports which (``loaded``).
    """
    if not platform.startswith("linux") or "mlx.core" in sys.modules:
        return None
    path = find(environ)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None  # reported by the worker as "none loaded", with the search path
    return path if hasattr(lib, "cblas_sgemm") else None


def loaded() -> str | None:
    """The optimized BLAS mapped into this process (however it got there: ``preload``,
    ``LD_PRELOAD``), from ``/proc/self/maps``; None when there is none or no procfs."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        path = Path(fields[5].strip()) if len(fields) == 6 else Path()
        # numpy's libscipy_openblas64_ is no match: its symbols are suffixed, MLX never uses it
        if path.name.startswith(("libopenblas", "libblis", "libmkl_rt")) or (
            path.name.startswith("libblas.so") and is_optimized(path)
        ):
            return str(path)
    return None
