"""`ollama:NAME[:TAG]` -> the GGUF blob its manifest names, in a fake store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.models import ollama

DIGEST = "ab" * 32


def make_store(root: Path, manifest: str = "registry.ollama.ai/library/smollm2/135m") -> Path:
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / f"sha256-{DIGEST}").write_bytes(b"GGUF")
    path = root / "manifests" / manifest
    path.parent.mkdir(parents=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
        {"mediaType": ollama.MODEL_MEDIA_TYPE, "digest": f"sha256:{DIGEST}"},
    ]
    path.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root


def test_a_name_and_tag_resolve_to_the_model_blob(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    blob = ollama.resolve("ollama:smollm2:135m", {"OLLAMA_MODELS": str(store)})
    assert blob == store / "blobs" / f"sha256-{DIGEST}"


def test_no_tag_means_latest_and_namespaces_are_kept(tmp_path: Path) -> None:
    store = make_store(tmp_path, "registry.ollama.ai/someone/model/latest")
    assert ollama.resolve("ollama:someone/model", {"OLLAMA_MODELS": str(store)}).is_file()


def test_the_store_defaults_to_the_home_directory() -> None:
    assert ollama.store_dir({}) == Path.home() / ".ollama" / "models"


def test_a_model_not_pulled_is_a_config_error(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(ConfigError, match="no manifest"):
        ollama.resolve("ollama:llama3:8b", {"OLLAMA_MODELS": str(store)})


@pytest.mark.parametrize("name", ["ollama:", "ollama:a//b", "ollama:../../etc:x", "ollama:a/b/c/d"])
def test_malformed_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="bad Ollama model name"):
        ollama.resolve(name, {"OLLAMA_MODELS": str(tmp_path)})


def test_a_missing_blob_is_a_config_error(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    (store / "blobs" / f"sha256-{DIGEST}").unlink()
    with pytest.raises(ConfigError, match="missing"):
        ollama.resolve("ollama:smollm2:135m", {"OLLAMA_MODELS": str(store)})
