"""--task against the model directory (engine_proc/model/task.py): what each layout serves, and the refusals."""
from __future__ import annotations

import json

import pytest

from rill.engine_proc.model.task import TASKS, Served, choose_served


def layout(path, kind: str):
    path.mkdir()
    if kind == "cross-encoder":
        config = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
    elif kind == "classifier":
        config = {"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 3}
    elif kind == "sentence-transformers":
        config = {"architectures": ["BertModel"]}
        (path / "modules.json").write_text("[]")
    else:
        config = {"architectures": ["Qwen3ForCausalLM"]}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("kind,served", [
    ("cross-encoder", {"auto": Served.CROSS_ENCODER, "score": Served.CROSS_ENCODER, "classify": Served.CLASSIFY}),
    ("classifier", {"auto": Served.CLASSIFY, "classify": Served.CLASSIFY}),
    ("sentence-transformers", {"auto": Served.EMBED, "embed": Served.EMBED}),
    ("decoder", {"auto": Served.GENERATE, "generate": Served.GENERATE, "score": Served.YES_NO}),
])
def test_each_task_on_each_layout(tmp_path, kind, served):
    model_dir = layout(tmp_path / kind, kind)
    for task in TASKS:
        if task in served:
            assert choose_served(task, model_dir) is served[task]
        else:
            with pytest.raises(ValueError, match=f"--task {task}: .* is a"):
                choose_served(task, model_dir)


def test_a_classifier_of_too_many_labels_stops_the_start(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"],
                                                      "num_labels": 100_000}))
    with pytest.raises(ValueError, match="100000 labels"):
        choose_served("auto", tmp_path)


def test_dtype_auto_keeps_float32_for_small_models_only(tmp_path):
    """A small encoder or classifier runs in float32 under --dtype auto; a large one (a reward model) and a decoder
    reranker keep the machine's choice."""
    from rill.engine_proc.encoder_engine import SMALL_MODEL_BYTES, auto_dtype

    machine = ("bfloat16", "AMX")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    assert auto_dtype(Served.CLASSIFY, tmp_path, *machine)[0] == "float32"
    assert auto_dtype(Served.EMBED, tmp_path, *machine)[0] == "float32"
    assert auto_dtype(Served.YES_NO, tmp_path, *machine) == machine
    with open(tmp_path / "model-00002-of-00002.safetensors", "wb") as f:  # sparse: no disk spent
        f.truncate(SMALL_MODEL_BYTES)
    assert auto_dtype(Served.CLASSIFY, tmp_path, *machine) == machine
