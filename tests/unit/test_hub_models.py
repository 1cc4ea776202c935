"""`rill serve ORG/NAME`, as `vllm serve` takes a model: found in a Hugging Face cache laid out as the hub's client
lays it out (refs, snapshots), at a branch or a commit; anything else is an error saying how to fetch it."""
from __future__ import annotations

import argparse
import json

import pytest

from rill.hub_models import cached_snapshot, looks_like_repo_id
from rill.launcher import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLDER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture()
def hub_cache(tmp_path):
    """A cache holding org/tiny-model at two commits, `main` the newer."""
    repo = tmp_path / "models--org--tiny-model"
    for commit in (COMMIT, OLDER):
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "commit": commit}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return tmp_path


def args(model: str, cache, revision=None, served=None) -> argparse.Namespace:
    return argparse.Namespace(model=model, revision=revision, download_dir=str(cache), cache_dir=None,
                              served_model_name=served)


def test_a_hub_id_is_its_cached_snapshot(hub_cache):
    folder = cached_snapshot("org/tiny-model", cache_dir=str(hub_cache))
    assert json.loads((folder / "config.json").read_text())["commit"] == COMMIT
    assert cached_snapshot("org/tiny-model", OLDER, str(hub_cache)).name == OLDER
    model_dir, model_id = resolve_model(args("org/tiny-model", hub_cache))
    assert model_dir.name == COMMIT and model_id == "org/tiny-model"  # vLLM's default name: the id as given
    assert resolve_model(args("org/tiny-model", hub_cache, served=["tiny"]))[1] == "tiny"


def test_what_is_not_cached_is_an_error_that_says_how_to_fetch_it(hub_cache, tmp_path):
    for model, revision in (("org/other", None), ("org/tiny-model", "v2")):
        with pytest.raises(SystemExit, match=f"never downloads.*hf download {model}"):
            resolve_model(args(model, hub_cache, revision))
    with pytest.raises(SystemExit, match="no config.json"):  # a local path is never looked up in the cache
        resolve_model(args(str(tmp_path / "missing" / "dir" / "deeper"), hub_cache))


def test_which_names_are_hub_ids():
    assert looks_like_repo_id("Qwen/Qwen2.5-1.5B-Instruct") and looks_like_repo_id("gpt2")
    assert not looks_like_repo_id("./models/qwen") and not looks_like_repo_id("/srv/models/qwen")
    assert not looks_like_repo_id("a/b/c") and not looks_like_repo_id("org/../etc")
    assert not looks_like_repo_id("model.gguf") and not looks_like_repo_id("~/models")
