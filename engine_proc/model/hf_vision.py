"""A vision-language model's images on the paged transformers route: each image's features, from the model's own
vision tower and projector, put in place of the prompt's image tokens in a prompt step's input embeddings.

The API worker's processor (asgi/prompt/vision.py) wrote one image token per feature row, so the k-th image token
of a prompt takes row k of its images' features, whichever chunk of the prompt it falls in. A request's features
are computed at its first chunk that holds an image token and dropped after its last (a preempted request
computes them again). Decode steps, and prompt steps without images, take the token ids as before.

Gemma 3's image tokens attend to each other both ways (transformers' token_type_ids mask): a prompt chunk holds such
an image whole (engine_proc/sched/request.py chunk_end), and in a step with one each image token sees up to its
image's last (whole_images; engine_proc/attention/masked.py).

Qwen2-VL's rotary positions are 3-D over an image (its time, row and column in the grid) and the text after an
image goes on from the largest of them, so a request's positions run `delta` (<= 0) behind its token count. The
model's own get_rope_index gives a request's prompt positions once; its later tokens are at their index + delta on
all three axes, which the compiled decode steps take as 1-D positions (decode_graphs.py's rope_offset). The KV
cache's slots stay by token index.
"""
from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from rill.engine_proc.attention.masked import ImageSpan, start_rows
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.images import MROPE_MODEL_TYPES, VISION_MODEL_TYPES, arrays_of


def is_vision_model(config) -> bool:
    return getattr(config, "model_type", None) in VISION_MODEL_TYPES


def attention_implementations(config, text_implementation: str) -> dict[str, str]:
    """The text model's attention through Rill's paged cache; the vision tower's through torch's SDPA."""
    return {name: text_implementation if name == "text_config" else "sdpa" for name in config.sub_configs}


@dataclass(eq=False)
class _Rope:
    prompt: torch.Tensor  # [3, prompt tokens]: each prompt token's position on the three axes
    delta: int  # a later token's position minus its index


@dataclass(eq=False)
class _Features:
    # [image tokens, hidden] each: every image's features in the prompt's order, then a DeepStack model's features
    # for its first layers' hidden states (Qwen3-VL), one per layer
    rows: list[torch.Tensor]
    positions: list[int]  # the prompt positions of its image tokens, ascending


class ImageEmbedder:
    """The inputs of a prompt step whose chunks hold image tokens: their features in place of their embeddings."""

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, decodes_first: bool) -> None:
        """`decodes_first`: the step's rows in that order (the attention backend's; masked.py row_order)."""
        self.model, self.device, self.dtype, self.decodes_first = model, device, dtype, decodes_first
        self.embed_tokens = model.get_input_embeddings()
        self._features: weakref.WeakKeyDictionary[EngineRequest, _Features] = weakref.WeakKeyDictionary()
        self.mrope = model.config.model_type in MROPE_MODEL_TYPES
        # Qwen3-VL adds features of its vision tower's middle layers to its first layers' hidden states (DeepStack)
        self.deepstack = bool(getattr(getattr(model.config, "vision_config", None), "deepstack_visual_indexes", None))
        self._ropes: weakref.WeakKeyDictionary[EngineRequest, _Rope] = weakref.WeakKeyDictionary()

    def rope_offset(self, req: EngineRequest) -> int:
        """What a decode token's rotary position is past its index (3-D rotary models with images; else 0)."""
        return 0 if req.params.images is None else self._rope_of(req).delta

    def positions(self, batch: Batch, positions: torch.Tensor) -> torch.Tensor | None:
        """[3, tokens]: a 3-D rotary model's positions for a step in which a request has images; else None."""
        if not self.mrope or all(s.req.params.images is None for s in batch.seqs):
            return None
        out = positions.expand(3, -1).clone()
        for seq, row in start_rows(batch, self.decodes_first):
            if seq.req.params.images is None:
                continue
            rope, start, end = self._rope_of(seq.req), seq.start_pos, seq.start_pos + seq.num_new_tokens
            in_prompt = max(0, min(end, rope.prompt.shape[1]) - start)
            out[:, row:row + in_prompt] = rope.prompt[:, start:start + in_prompt]
            out[:, row + in_prompt:row + end - start] += rope.delta
        return out

    def _rope_of(self, req: EngineRequest) -> _Rope:
        if (rope := self._ropes.get(req)) is None:
            ids = torch.tensor([req.prompt_ids])
            grids = torch.from_numpy(arrays_of(req.params.images)["image_grid_thw"].copy())
            table, delta = self.model.model.get_rope_index(ids, (ids == req.params.images.token_id).int(), grids)
            rope = self._ropes[req] = _Rope(table[:, 0].to(self.device), int(delta.reshape(-1)[0]))
        return rope

    def whole_images(self, batch: Batch) -> list[ImageSpan]:
        return whole_images(batch, self.decodes_first)

    @staticmethod
    def needed(batch: Batch) -> bool:
        return any(s.req.params.images is not None and s.start_pos < s.req.num_prompt_tokens for s in batch.seqs)

    def __call__(self, batch: Batch, input_ids: torch.Tensor) -> dict:
        """The forward's keywords for the step's tokens, in place of its ids: their input embeddings, image tokens'
        rows replaced by their features; for a DeepStack model (Qwen3-VL), the ids and the features of the step's
        image tokens in their order as the model's own image outputs, which its forward puts in place and adds to
        its first layers' hidden states."""
        pieces = []  # (the image tokens' rows in the step, their rows of each of _Features.rows)
        for seq, row in start_rows(batch, self.decodes_first):
            req, images = seq.req, seq.req.params.images
            end = seq.start_pos + seq.num_new_tokens
            if images is None or seq.start_pos >= req.num_prompt_tokens:
                continue
            prompt_ids = np.asarray(req.prompt_ids[seq.start_pos:min(end, req.num_prompt_tokens)])
            offsets = np.flatnonzero(prompt_ids == images.token_id)
            if not len(offsets):
                continue
            features = self._features_of(req)
            first = bisect.bisect_left(features.positions, seq.start_pos)
            pieces.append((offsets + row, [rows[first:first + len(offsets)] for rows in features.rows]))
            if end > features.positions[-1]:  # past its last image token: not needed again
                del self._features[req]
        if self.deepstack:
            inputs = {"input_ids": input_ids.unsqueeze(0)}
            if pieces:
                inputs["mm_encoder_outputs"] = {"image": self._step_outputs(input_ids, pieces)}
            return inputs
        embeds = self.embed_tokens(input_ids)
        for offsets, rows in pieces:
            embeds[torch.as_tensor(offsets, device=embeds.device)] = rows[0].to(embeds.dtype)
        return {"inputs_embeds": embeds.unsqueeze(0)}

    def _step_outputs(self, input_ids: torch.Tensor, pieces: list):
        """A DeepStack model's image outputs for the step: a row for every row of the step whose id is the image
        token, as its forward takes them (input_ids == image_token_id). One that is no image's (a client's prompt
        of token ids, or a generated token, that holds the image token) gets the token's own embedding and no
        DeepStack features: it stays that token, and the other requests' images still match their rows."""
        token_id = self.model.config.image_token_id
        all_rows = torch.nonzero(input_ids == token_id).flatten().tolist()
        index = {row: i for i, row in enumerate(all_rows)}
        own = self.embed_tokens(torch.tensor([token_id], device=input_ids.device))
        layers = [own.expand(len(all_rows), -1).clone()]
        layers += [torch.zeros(len(all_rows), rows.shape[-1], dtype=rows.dtype, device=rows.device)
                   for rows in pieces[0][1][1:]]
        for offsets, rows in pieces:
            at = torch.tensor([index[int(row)] for row in offsets], device=input_ids.device)
            for layer, piece in zip(layers, rows):
                layer[at] = piece.to(layer.dtype)
        return self._output_class(pooler_output=[layers[0]], deepstack_features=[[r] for r in layers[1:]])

    def _features_of(self, req: EngineRequest) -> _Features:
        if (features := self._features.get(req)) is not None:
            return features
        images = req.params.images
        kwargs = {name: torch.from_numpy(array.copy()).to(self.device) for name, array in arrays_of(images).items()}
        if "pixel_values" in kwargs:
            kwargs["pixel_values"] = kwargs["pixel_values"].to(self.dtype)
        out = self.model.get_image_features(**kwargs)
        self._output_class = type(out)  # a DeepStack model's image outputs are given back to its forward as such
        rows = [_rows(getattr(out, "pooler_output", out))]  # transformers 5 answers a model output
        rows += [_rows(layer) for layer in getattr(out, "deepstack_features", None) or ()]
        positions = np.flatnonzero(np.asarray(req.prompt_ids) == images.token_id).tolist()
        if len(positions) != rows[0].shape[0]:  # the worker's processor and this model disagree
            raise ValueError(f"request {req.req_id}: {len(positions)} image tokens for {rows[0].shape[0]} feature rows")
        features = self._features[req] = _Features(rows, positions)
        return features


def _rows(out) -> torch.Tensor:
    """[image tokens, hidden]: features as get_image_features answers them, one tensor or one per image."""
    if isinstance(out, (list, tuple)):
        return torch.cat([f.reshape(-1, f.shape[-1]) for f in out])
    return out.reshape(-1, out.shape[-1])


def whole_images(batch: Batch, decodes_first: bool) -> list[ImageSpan]:
    """The rows of the step's prompt chunks that are tokens of an image attending both ways (Gemma 3), an ImageSpan
    per image, in the step's row order (masked.py's row_order): each sees its whole image, which the scheduler put
    in this chunk whole (request.py chunk_end). [] in a step without one."""
    spans = []
    for i, (seq, row) in enumerate(start_rows(batch, decodes_first)):
        start, end = seq.start_pos, seq.start_pos + seq.num_new_tokens
        for first, last in seq.req.image_runs:
            if max(first, start) < min(last, end):
                spans.append(ImageSpan(i, row + max(first, start) - start, row + min(last, end) - start, last - 1))
    return spans
