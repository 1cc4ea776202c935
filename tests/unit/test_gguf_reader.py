"""Rill's GGUF reader gives back what gguf's own reader gives: every field (strings, numbers, arrays of each, an
array of arrays) and every tensor, on a file written here with gguf's writer."""
from __future__ import annotations

import gguf
import numpy as np

from rill.engine_proc.model.gguf_reader import read_gguf


def test_every_field_and_tensor_is_what_ggufs_reader_reads(tmp_path):
    path = tmp_path / "fields.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "a model")
    writer.add_uint32("llama.block_count", 3)
    writer.add_float32("llama.rope.freq_base", 10000.5)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_token_list(["<s>", "", "héllo", "▁world", *(f"t{i}" for i in range(300))])
    writer.add_token_scores([float(i) / 7 for i in range(304)])
    writer.add_token_types([1, 3, *([1] * 302)])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.floats", [0.5, -2.25])
    writer.add_tensor("a.weight", np.arange(24, dtype=np.float32).reshape(4, 6))
    writer.add_tensor("b.weight", np.arange(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    want, got = gguf.GGUFReader(str(path)), read_gguf(path)
    assert list(got.fields) == list(want.fields) and len(want.fields) > 10
    for key, field in want.fields.items():
        mine = got.fields[key]
        assert (mine.offset, mine.name, mine.types, mine.data) == (field.offset, field.name, field.types, field.data), key
        assert len(mine.parts) == len(field.parts), key
        for a, b in zip(mine.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), key
        if field.types != [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.ARRAY]:  # contents() flattens nested ones
            assert mine.contents() == field.contents(), key
    assert got.fields["tokenizer.ggml.tokens"].contents()[:4] == ["<s>", "", "héllo", "▁world"]
    assert got.fields["test.nested"].types[:2] == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.ARRAY]
    assert [t.name for t in got.tensors] == [t.name for t in want.tensors] == ["a.weight", "b.weight"]
    for a, b in zip(got.tensors, want.tensors):
        assert (a.tensor_type, a.data_offset, a.n_elements, list(a.shape)) == (b.tensor_type, b.data_offset,
                                                                               b.n_elements, list(b.shape))
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)


def test_a_conversion_builds_each_name_map_and_reads_each_file_once(tmp_path):
    """Within a conversion (gguf_dir._one_reader) gguf's name map of an architecture is built once, however many
    modules transformers asks it for, and a file is parsed once; after it, gguf's own functions are back."""
    from rill.engine_proc.model.gguf_dir import _one_reader

    path = tmp_path / "one.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("a.weight", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arch, reader_class = gguf.MODEL_ARCH.LLAMA, gguf.GGUFReader
    with _one_reader():
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.get_tensor_name_map(arch, 2) is not gguf.get_tensor_name_map(arch, 30)
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(path)
    assert gguf.get_tensor_name_map(arch, 30) is not gguf.get_tensor_name_map(arch, 30)
    assert gguf.GGUFReader is reader_class
