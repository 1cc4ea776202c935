"""ChatTemplate: where templates come from, HF-compatible rendering, errors as TemplateError."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from rill.asgi.prompt.templating import ChatTemplate, TemplateError

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "  naïve 世界  "},
]


def _write_model_dir(path: Path, config: dict, **files: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


def test_bundled_model_template_renders_like_transformers(model_dir):
    from transformers import AutoTokenizer

    template = ChatTemplate(model_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    for messages in (MESSAGES, MESSAGES[1:2], MESSAGES[:2]):
        for add_generation_prompt in (True, False):
            expected = hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            rendered = template.render(messages, add_generation_prompt=add_generation_prompt)
            assert rendered == expected
    assert template.eos_token == "<|im_end|>"
    assert template.origin != str(Path(__file__).parents[2] / "templates" / "chatml.jinja")


def test_template_sources_in_order(tmp_path):
    # 1. tokenizer_config.json, list form: the one named "default".
    listed = _write_model_dir(tmp_path / "listed", {"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT {{ messages | length }}"},
    ]}, chat_template__jinja="FROM JINJA FILE")
    assert ChatTemplate(listed).render(MESSAGES) == "DEFAULT 4"
    # 2. chat_template.jinja beside it.
    jinja_only = _write_model_dir(tmp_path / "jinja", {}, chat_template__jinja="FROM JINJA FILE")
    assert ChatTemplate(jinja_only).render(MESSAGES) == "FROM JINJA FILE"
    # 3. Nothing: the bundled ChatML.
    bare = _write_model_dir(tmp_path / "bare", {"eos_token": "<|im_end|>"})
    template = ChatTemplate(bare)
    assert template.origin.endswith("templates/chatml.jinja")
    assert template.render(MESSAGES[1:2]) == (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_special_tokens_as_strings_or_added_token_dicts(tmp_path):
    model_dir = _write_model_dir(tmp_path / "m", {
        "chat_template": "{{ bos_token }}|{{ eos_token }}",
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
        "eos_token": "</s>",
    })
    template = ChatTemplate(model_dir)
    assert template.render(MESSAGES) == "<s>|</s>"
    assert template.renders_bos_token


def test_from_file_takes_special_tokens_from_the_model_dir(tmp_path):
    model_dir = _write_model_dir(tmp_path / "m", {"bos_token": "<|begin_of_text|>"})
    path = tmp_path / "mine.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}")
    assert ChatTemplate.from_file(path, model_dir=model_dir).render(MESSAGES[:2]) == (
        "<|begin_of_text|>[system][user]")
    assert ChatTemplate.from_file(path).render(MESSAGES[:1]) == "[system]"


def test_bundled_chatml_llama3_plain():
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    chatml = ChatTemplate.bundled("chatml")
    assert chatml.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
    assert not chatml.renders_bos_token

    llama3 = ChatTemplate.from_string(
        (Path(__file__).resolve().parents[2] / "templates" / "llama3.jinja").read_text(),
        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert llama3.render(MESSAGES[1:]) == (
        "<|begin_of_text|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nnaïve 世界<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama3.renders_bos_token

    plain = ChatTemplate.bundled("plain")
    assert plain.render(MESSAGES[:2]) == "system: Be brief.\nuser: Hi there\nassistant:"

    with pytest.raises(TemplateError, match="no bundled chat template"):
        ChatTemplate.bundled("nonexistent")


def test_hf_environment_features():
    template = ChatTemplate.from_string(
        "{{ tools | tojson }}|{{ strftime_now('%Y') }}|{{ greeting }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.role }}{% endfor %}|"
        "{% generation %}{{ 'gen' }}{% endgeneration %}|{{ documents is none }}")
    rendered = template.render(MESSAGES, tools=[{"name": "météo"}], greeting="hej")
    year = str(datetime.now().year)
    assert rendered == f'[{{"name": "météo"}}]|{year}|hej|system|gen|True'


def test_trim_and_lstrip_blocks_like_hf():
    template = ChatTemplate.from_string(
        "{% for m in messages %}\n    {% if true %}\n{{ m.role }}\n{% endif %}\n{% endfor %}")
    assert template.render(MESSAGES[:2]) == "system\nuser\n"


def test_syntax_error_is_raised_at_construction():
    with pytest.raises(TemplateError, match="line 1"):
        ChatTemplate.from_string("{% for m in messages %}{{ m.role }", origin="broken.jinja")


@pytest.mark.parametrize("source, messages, message", [
    ("{{ raise_exception('Conversation roles must alternate') }}", MESSAGES,
     "Conversation roles must alternate"),
    ("{{ messages[0].content.text.upper() }}", MESSAGES, "has no attribute"),
    ("{{ '<|im_start|>' + messages[0]['content'] }}", [{"role": "user", "content": None}],
     "TypeError"),
    ("{{ ''.__class__.__mro__ }}", MESSAGES, "unsafe|access"),
    ("{{ messages.append(1) }}", MESSAGES, "unsafe|append"),
])
def test_render_errors_become_template_errors(source, messages, message):
    template = ChatTemplate.from_string(source)
    with pytest.raises(TemplateError, match=message):
        template.render(messages)


def test_template_errors_are_value_errors():
    # The API maps ValueError-like faults of the request to a 400.
    assert issubclass(TemplateError, ValueError)
