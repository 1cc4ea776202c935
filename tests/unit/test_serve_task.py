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
