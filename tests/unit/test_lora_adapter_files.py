"""LoRA adapter files: whatever a path holds, loading it gives an adapter or AdapterError (a 400),
never another exception (which once left the engine's busy loop and stopped the server)."""
from __future__ import annotations

import pytest

from rill.engine_proc.lora.adapter import AdapterError, load_adapter
from tests.helpers.tiny_lora import broken_adapters, tiny_config, write_adapter

REASONS = {
    "config_is_a_list": "must be a JSON object",
    "config_nested_deep": "is not JSON",
    "config_not_utf8": "is not JSON",
    "alpha_not_a_number": "lora_alpha must be a number",
    "truncated_weights": "not a valid safetensors file",
    "weights_not_safetensors": "not a valid safetensors file",
    "nan_weights": "must be floating point and finite",
    "name_too_long": "cannot read",
    "path_is_a_file": "not a PEFT adapter directory",
    "nested_in_a_file": "not a PEFT adapter directory",
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return broken_adapters(tmp_path_factory.mktemp("adapters"))


def test_a_good_adapter_loads(tmp_path):
    adapter = load_adapter("good", write_adapter(tmp_path / "a", seed=1), tiny_config(), max_rank=8)
    assert adapter.rank == 4 and len(adapter.weights) == 2 * 7


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_a_broken_adapter_is_an_adapter_error_naming_why(broken, kind):
    with pytest.raises(AdapterError) as exc:
        load_adapter("x", broken[kind], tiny_config(), max_rank=8)
    assert REASONS[kind] in str(exc.value) and "'x'" in str(exc.value)


def test_an_oversized_config_is_refused_unread(tmp_path):
    path = write_adapter(tmp_path / "a", seed=1)
    (path / "adapter_config.json").write_text('{"r": 4, "pad": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(AdapterError, match="adapter_config.json is over"):
        load_adapter("x", path, tiny_config(), max_rank=8)
