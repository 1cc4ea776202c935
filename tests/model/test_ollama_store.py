"""`rill serve ollama:NAME[:TAG]`: a model Ollama pulled, found through its manifest in a store laid out as Ollama
lays it out (manifests, then content-addressed blobs), its GGUF blob converted as any GGUF file is; and the errors
that say why a name cannot be served."""
from __future__ import annotations

import argparse
import hashlib
import json

import pytest

from rill.launcher import resolve_model
from rill.ollama_models import MODEL_LAYER, ollama_blob, ollama_name
from tests.helpers.gguf_files import tiny_model, write_gguf


def pull(store, name: str, tag: str, blob_bytes: bytes, namespace: str = "library", layers: list | None = None):
    """What `ollama pull` leaves: the blob under its digest, and the manifest naming it."""
    digest = "sha256:" + hashlib.sha256(blob_bytes).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    (store / "blobs" / digest.replace(":", "-")).write_bytes(blob_bytes)
    manifest = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    params = {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "0" * 64}
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers if layers is not None else
                                    [params, {"mediaType": MODEL_LAYER, "digest": digest, "size": len(blob_bytes)}]}))
    return store / "blobs" / digest.replace(":", "-")


@pytest.fixture()
def store(tmp_path, monkeypatch):
    store = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def args(model: str, cache) -> argparse.Namespace:
    return argparse.Namespace(model=model, cache_dir=str(cache), served_model_name=None, revision=None,
                              download_dir=None)


def test_a_pulled_model_is_served_from_its_blob(store, tmp_path):
    gguf_bytes = write_gguf(tiny_model(), tmp_path / "tiny.gguf").read_bytes()
    blob = pull(store, "tiny", "latest", gguf_bytes)
    assert ollama_name("ollama:tiny") == ollama_name("ollama://tiny") == "tiny" and ollama_name("tiny") is None
    assert ollama_blob("tiny") == ollama_blob("tiny:latest") == blob
    model_dir, model_id = resolve_model(args("ollama:tiny", tmp_path / "cache"))
    assert model_id == "tiny" and (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"
    other = pull(store, "tiny", "q8", gguf_bytes + b"", namespace="me")  # a user's namespace and a tag
    assert ollama_blob("me/tiny:q8") == other


def test_what_cannot_be_served_says_why(store, tmp_path):
    pull(store, "nolayer", "latest", b"x", layers=[{"mediaType": "application/vnd.ollama.image.template",
                                                     "digest": "sha256:" + "1" * 64}])
    pull(store, "gone", "latest", b"y").unlink()
    pull(store, "notgguf", "latest", b"not a gguf file")
    for model, why in (("ollama:missing", "ollama pull missing"), ("ollama:../etc", "not an Ollama model name"),
                       ("ollama:a/b/c/d", "not an Ollama model name"), ("ollama:nolayer", "no model layer"),
                       ("ollama:gone", "missing from Ollama's store"), ("ollama:notgguf", "not a GGUF file")):
        with pytest.raises(SystemExit, match=why):
            resolve_model(args(model, tmp_path / "cache"))
