"""The LoRA flags: what `rill serve` refuses with exit 2 before it starts anything."""
from __future__ import annotations

import argparse
import json

import pytest

from rill.cli import serve_parser
from rill.lora_flags import check_lora_flags, lora_modules


def parse(*argv: str):
    parser = serve_parser(argparse.ArgumentParser().add_subparsers())
    args = parser.parse_args(list(argv))
    check_lora_flags(args, parser)
    return args


@pytest.fixture
def adapter(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    return str(tmp_path)


def test_modules_by_name_or_vllms_json(adapter):
    args = parse("--enable-lora", "--max-loras", "2", "--lora-modules", f"a={adapter}",
                 json.dumps({"name": "b", "path": adapter, "base_model_name": "x"}))
    assert lora_modules(args) == {"a": adapter, "b": adapter}


@pytest.mark.parametrize("argv, message", [
    (("--lora-modules", "a=/x"), "needs --enable-lora"),
    (("--enable-lora", "--lora-modules", "a=/nowhere"), "not a PEFT adapter directory"),
    (("--enable-lora", "--lora-modules", "justaname"), "expected name=path"),
    (("--enable-lora", "--max-loras", "0"), "at least 1"),
])
def test_bad_lora_flags_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_more_adapters_than_slots_and_a_name_twice(adapter, capsys):
    for argv, message in [(("--lora-modules", f"a={adapter}", f"b={adapter}"), "more than --max-loras 1"),
                          (("--max-loras", "2", "--lora-modules", f"a={adapter}", f"a={adapter}"), "given twice")]:
        with pytest.raises(SystemExit):
            parse("--enable-lora", *argv)
        assert message in capsys.readouterr().err
