"""--limit-mm-per-prompt, vLLM's JSON object of counts by modality: images only, bounded."""
from __future__ import annotations

import pytest

from rill.chat_flags import DEFAULT_IMAGES, MAX_IMAGES, images_per_prompt


@pytest.mark.parametrize("text,count", [(None, DEFAULT_IMAGES), ("", DEFAULT_IMAGES), ('{"image": 3}', 3),
                                        ('{"image": 0}', 0), ('{"video": 0, "audio": 0, "image": 1}', 1),
                                        ("{}", DEFAULT_IMAGES), (f'{{"image": {MAX_IMAGES}}}', MAX_IMAGES)])
def test_counts(text, count):
    assert images_per_prompt(text) == count


@pytest.mark.parametrize("text,says", [('{"video": 1}', "only images"), ('{"image": -1}', "whole number"),
                                       (f'{{"image": {MAX_IMAGES + 1}}}', "whole number"),
                                       ('{"image": true}', "whole number"), ('{"image": 1.5}', "whole number"),
                                       ("[1]", "JSON object"), ("image=2", "not JSON")])
def test_bad_limits_say_why(text, says):
    with pytest.raises(ValueError, match=says):
        images_per_prompt(text)
