"""--limit-mm-per-prompt, vLLM's JSON object of counts by modality: images only, bounded; --mm-processor-kwargs,
Qwen-VL's pixel budget only, bounded."""
from __future__ import annotations

import pytest

from rill.chat_flags import DEFAULT_IMAGES, MAX_IMAGES, images_per_prompt, processor_kwargs
from rill.ipc.images import MAX_PIXELS, MIN_PIXELS


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


@pytest.mark.parametrize("text,kwargs", [(None, {}), ("{}", {}), ('{"max_pixels": 2007040}', {"max_pixels": 2007040}),
                                         ('{"min_pixels": 3136, "max_pixels": 3136}', {"min_pixels": 3136, "max_pixels": 3136}),
                                         (f'{{"max_pixels": {MAX_PIXELS}, "min_pixels": {MIN_PIXELS}}}',
                                          {"max_pixels": MAX_PIXELS, "min_pixels": MIN_PIXELS})])
def test_pixel_budgets(text, kwargs):
    assert processor_kwargs(text) == kwargs


@pytest.mark.parametrize("text,says", [('{"num_crops": 4}', "only min_pixels and max_pixels"),
                                       (f'{{"max_pixels": {MAX_PIXELS + 1}}}', "whole number of pixels"),
                                       (f'{{"min_pixels": {MIN_PIXELS - 1}}}', "whole number of pixels"),
                                       ('{"max_pixels": 1e6}', "whole number"), ('{"max_pixels": true}', "whole number"),
                                       ('{"min_pixels": 2000000}', "the default"),
                                       ('{"min_pixels": 5000, "max_pixels": 4000}', "more than max_pixels"),
                                       ("[1]", "JSON object"), ("max_pixels=1", "not JSON")])
def test_bad_budgets_say_why(text, says):
    with pytest.raises(ValueError, match=says):
        processor_kwargs(text)
