"""Send text + images to a model through the shared `toolkit.llm` backends.

An OpenAI-compatible server receives the images as base64 `image_url` content parts (the vLLM / OpenAI vision
format); a backend that cannot take images (a local causal LM such as zoo:smollm2-135m) gets the text alone, and
`VisionModel.sees_images` says so, so every report can state which variant ran."""

from __future__ import annotations

import base64
import io
from typing import Sequence

from PIL import Image

from toolkit.llm.base import LLM


def image_to_data_url(image: Image.Image, max_side: int = 768, quality: int = 85) -> str:
    """JPEG-encode (downscaled so the longer side is at most max_side) as a data: URL."""
    picture = image.convert("RGB")
    if max(picture.size) > max_side:
        scale = max_side / max(picture.size)
        picture = picture.resize((max(1, round(picture.width * scale)), max(1, round(picture.height * scale))))
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def vision_content(text: str, images: Sequence[Image.Image], max_side: int) -> list[dict]:
    """OpenAI chat content: the images first (as lmms-eval's openai_compatible model sends video frames), then the
    text."""
    parts = [{"type": "image_url", "image_url": {"url": image_to_data_url(image, max_side)}} for image in images]
    return parts + [{"type": "text", "text": text}]


class VisionModel:
    """`ask(text, images)` -> reply text; images are dropped when the backend cannot take them."""

    def __init__(self, llm: LLM, use_images: bool = True, max_side: int = 768, temperature: float = 0.0,
                 seed: int = 0):
        from toolkit.llm.openai_backend import OpenAIBackend

        self.llm, self.max_side, self.temperature, self.seed = llm, max_side, temperature, seed
        self.sees_images = use_images and isinstance(llm, OpenAIBackend)

    @property
    def modality(self) -> str:
        return "vision (base64 images)" if self.sees_images else "text-only (images withheld from the model)"

    def ask(self, text: str, images: Sequence[Image.Image] = (), max_new_tokens: int = 64,
            stop: Sequence[str] | None = None) -> str:
        if self.sees_images and images:
            messages = [{"role": "user", "content": vision_content(text, images, self.max_side)}]
            return self.llm.chat(messages, max_new_tokens, self.temperature, stop, self.seed).text
        return self.llm.generate([text], max_new_tokens=max_new_tokens, temperature=self.temperature, stop=stop,
                                 seed=self.seed, chat=True)[0].text


class ModelPool:
    """Loads each model spec once (the answering model often doubles as extractor or judge); a server backend keeps
    up to `concurrency` requests in flight (its `.concurrency`; local models have 1)."""

    def __init__(self, device: str, dtype=None, cache_dir: str | None = None, timeout: float = 600.0,
                 concurrency: int = 1):
        self.device, self.dtype, self.cache_dir, self.timeout = device, dtype, cache_dir, timeout
        self.concurrency = concurrency
        self._loaded: dict[str, LLM] = {}

    def get(self, spec: str) -> LLM:
        if spec not in self._loaded:
            from toolkit.llm import load_llm

            self._loaded[spec] = load_llm(spec, device=self.device, dtype=self.dtype, cache_dir=self.cache_dir,
                                          timeout=self.timeout, concurrency=self.concurrency)
        return self._loaded[spec]

    def close(self) -> None:
        for llm in self._loaded.values():
            llm.close()
