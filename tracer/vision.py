"""The vision encoder's work for `--image-tokens N`: the model's own `get_image_features` on meta images.

Fixed-resolution encoders (CLIP, SigLIP, ...: LLaVA, PaliGemma, Llama-4, ...) turn every image into the same
number of tokens, read here from a first (unrecorded) call on one image. N image tokens per sequence are then
ceil(N / tokens per image) images per sequence, encoded in one recorded call. Encoders whose input layout depends
on the image itself (Qwen-VL's grids, Pixtral's sizes) cannot be run without real images: for those the trace
says that the encoder's work is not counted (the N tokens still run through the language model).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch


@dataclass
class VisionResult:
    images: int = 0                 # per sequence
    tokens_per_image: int = 0
    note: str = ""


def _image_size(vision_config) -> tuple[int, int] | None:
    size = getattr(vision_config, "image_size", None)
    if isinstance(size, int):
        return size, size
    if isinstance(size, (tuple, list)) and len(size) == 2 and all(isinstance(s, int) for s in size):
        return int(size[0]), int(size[1])
    return None


def _features(model, config, images: int, size: tuple[int, int], dtype):
    vision = config.vision_config
    params = inspect.signature(model.get_image_features).parameters
    kwargs = {}
    if "image_sizes" in params:
        kwargs["image_sizes"] = torch.tensor([list(size)] * images, device="cpu")
    for name in ("vision_feature_select_strategy", "vision_feature_layer"):
        if name in params and getattr(config, name, None) is not None:
            kwargs[name] = getattr(config, name)
    pixels = torch.empty(images, getattr(vision, "num_channels", 3), *size, dtype=dtype, device="meta")
    out = model.get_image_features(pixel_values=pixels, **kwargs)
    for candidate in (out, getattr(out, "pooler_output", None), getattr(out, "last_hidden_state", None)):
        if isinstance(candidate, (tuple, list)) and candidate:
            candidate = candidate[0]
        if isinstance(candidate, torch.Tensor):
            return candidate
    return None


def encode_images(model, config, recorder, image_tokens: int, batch: int) -> VisionResult:
    """Record the encoder's work for `image_tokens` image tokens in each of `batch` sequences."""
    name = type(model).__name__
    vision = getattr(config, "vision_config", None)
    if vision is None or not hasattr(model, "get_image_features"):
        return VisionResult(note=f"{name} has no vision encoder: the {image_tokens} image tokens per sequence "
                                 f"are counted through the language model only")
    size = _image_size(vision)
    if size is None:
        return VisionResult(note=f"vision encoder work not counted: {type(vision).__name__} takes images of "
                                 f"varying resolution (its patch layout needs real images); the {image_tokens} "
                                 f"image tokens per sequence are counted through the language model")
    dtype = next(model.parameters()).dtype
    try:
        with recorder.suppressed():
            probe = _features(model, config, 1, size, dtype)
        if probe is None or probe.dim() < 2:
            raise ValueError("no image features returned")
        per_image = probe.numel() // probe.shape[-1]
        images = math.ceil(image_tokens / per_image)
        _features(model, config, images * batch, size, dtype)
    except Exception as e:  # noqa: BLE001 - a model-specific encoder path: say it is not counted, in one line
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return VisionResult(note=f"vision encoder work not counted for {name} ({type(e).__name__}: {text[:80]}); "
                                 f"the {image_tokens} image tokens per sequence are counted through the language "
                                 f"model")
    return VisionResult(images=images, tokens_per_image=per_image,
                        note=f"vision encoder: {images} image(s) of {size[0]}x{size[1]} per sequence "
                             f"({per_image} tokens each) for {image_tokens} image tokens, encoded by "
                             f"{type(vision).__name__}; the language model runs the image tokens as prefill input")
