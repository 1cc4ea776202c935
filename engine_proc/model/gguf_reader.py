"""gguf's GGUFReader, 10x faster at reading a file's header (its tokenizer's arrays of strings).

The package's reader slices its `np.memmap` once or twice per array element, and a memmap's slice is a memmap
whose construction costs far more than the slice: 3.7 s for the 49,152-token vocabulary of the bundled model's file,
longer than loading its weights, and about three times that for Qwen's 151,936. This reader slices a plain ndarray
view of the same map (the same bytes, no copy) and reads an array of strings in one loop. What it returns is what
the package's reader returns (a test compares every field and tensor), as plain ndarray views of the map.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFValueType


class FastGGUFReader(gguf.GGUFReader):
    @functools.cached_property
    def _plain(self) -> np.ndarray:
        """The map as a plain ndarray (what self.data is, without memmap's cost per slice)."""
        return self.data.view(np.ndarray)

    def _get(self, offset, dtype, count=1, override_order=None):
        dtype = np.dtype(dtype)
        count = int(count)
        arr = self._plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        """An array of strings or of numbers in one loop, laid out as the package's reader lays it out: the item
        type, the length, then each item's parts (a string's length and bytes, a number's one-element array)."""
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        itype = GGUFValueType(int(raw_itype[0]))
        alen = self._get(orig_offs + 4, np.uint64)
        count, offs, plain = int(alen[0]), orig_offs + 12, self._plain
        parts: list[np.ndarray] = [raw_itype, alen]
        if itype == GGUFValueType.STRING:
            length = np.dtype(np.uint64).newbyteorder(self.byte_order)
            for _ in range(count):
                slen = plain[offs:offs + 8].view(length)
                end = offs + 8 + int(slen[0])
                parts += (slen, plain[offs + 8:end])
                offs = end
            data_idxs = list(range(3, len(parts), 2))
        elif (nptype := self.gguf_scalar_to_np.get(itype)) is not None:
            values = self._get(offs, nptype, count)
            parts += (values[i:i + 1] for i in range(count))
            data_idxs = list(range(2, len(parts)))
            offs += int(values.nbytes)
        else:  # an array of arrays
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, parts, data_idxs, [GGUFValueType.ARRAY] + ([itype] if count else [])


# llama.cpp's split files (llama-gguf-split): NAME-00001-of-00003.gguf, ...; the first holds the metadata.
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class SplitGGUFReader:
    """A split GGUF's parts read as one file: the first part's fields, every part's tensors in order. What
    transformers' loader reads of a reader (`fields`, `tensors`) and Rill's (`get_field`)."""

    def __init__(self, first: Path) -> None:
        parts = split_parts(first)
        readers = [FastGGUFReader(str(part)) for part in parts]
        self.fields = readers[0].fields
        self.get_field = readers[0].get_field
        self.tensors = [tensor for reader in readers for tensor in reader.tensors]
        declared = self.get_field("split.tensors.count")
        if declared is not None and int(declared.contents()) != len(self.tensors):
            raise ValueError(f"{first.name}: its parts hold {len(self.tensors)} tensors, the file says "
                             f"{int(declared.contents())}")


def split_parts(first: Path) -> list[Path]:
    """Every part's path from the first's name; a missing one is an error naming it."""
    match = SPLIT.search(first.name)
    count = int(match.group(2))
    stem = first.name[:match.start()]
    parts = [first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    if missing := [part.name for part in parts if not part.is_file()]:
        raise ValueError(f"{first.name} is the first of {count} parts: {', '.join(missing)} not found beside it")
    return parts


def read_gguf(path: str | Path) -> gguf.GGUFReader | SplitGGUFReader:
    """The file's reader; for the first part of a split file, all its parts as one."""
    path = Path(path)
    if (match := SPLIT.search(path.name)) and int(match.group(2)) > 1:
        return SplitGGUFReader(path)
    return FastGGUFReader(str(path))
