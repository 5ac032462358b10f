"""Video frames and subtitles the way lmms-eval's VideoMathQA task reads them.

- frames: `uniform_sample(m, n)` picks round(i·(m−1)/(n−1)) of the m decoded frames;
- subtitles: an SRT cue covers frames [int(start·fps), int(end·fps)); the cues shown are those covering any of
  `linspace(0, total−1, n, dtype=int)` (a different index rule from the frames, as upstream), in file order.

Decoding uses PyAV (`pip install av`); it counts frames by demuxing first, then decodes once and keeps only the
sampled frames, so an hour-long video never sits in memory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from toolkit.core.errors import BadInputError, ResourceError

_TIME = re.compile(r"^\s*(\d+):(\d{1,2}):(\d{1,2})[,.](\d{1,3})\s*$")


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    text: str


def uniform_sample(m: int, n: int) -> list[int]:
    if not 1 <= n <= m:
        raise BadInputError(f"cannot sample {n} frames from a video with {m}")
    stride = (m - 1) / (n - 1) if n > 1 else 0
    return [int(round(i * stride)) for i in range(n)]


def parse_srt_time(stamp: str) -> float:
    match = _TIME.match(stamp)
    if match is None:
        raise BadInputError(f"bad SRT time stamp {stamp!r}", "expected HH:MM:SS,mmm")
    hours, minutes, seconds, millis = match.groups()
    return int(hours) * 3600 + int(minutes) * 60 + int(seconds) + int(millis.ljust(3, "0")) / 1000


def parse_srt(text: str) -> list[Cue]:
    """Blocks separated by blank lines: index, `start --> end`, then text lines joined by spaces (upstream keeps
    one cue per distinct (start, end); we keep that rule)."""
    cues: dict[tuple[float, float], str] = {}
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").strip()):
        lines = block.split("\n")
        if len(lines) < 3 or "-->" not in lines[1]:
            continue
        start, end = (parse_srt_time(part) for part in lines[1].split("-->"))
        cues[(start, end)] = " ".join(lines[2:])
    return [Cue(start, end, words) for (start, end), words in cues.items()]


def subtitles_for_frames(cues: list[Cue], fps: float, total_frames: int, frame_num: int) -> str:
    """Cues covering the linspace-sampled frames (frame_num −1 = every frame), joined by newlines."""
    count = total_frames if frame_num == -1 else frame_num
    sampled = np.linspace(0, total_frames - 1, count, dtype=int)
    spans = [(int(cue.start * fps), int(cue.end * fps)) for cue in cues]
    shown = [i for i, (first, stop) in enumerate(spans) if np.any((sampled >= first) & (sampled < stop))]
    return "\n".join(cues[i].text for i in shown)


def _open(path: Path):
    try:
        import av
    except ImportError:
        raise ResourceError("reading videos needs PyAV", "pip install av") from None
    try:
        return av.open(str(path))
    except Exception as exc:  # noqa: BLE001 - av raises many error types for unreadable files
        raise BadInputError(f"cannot read video {path}: {exc}") from None


def video_info(path: Path) -> tuple[int, float]:
    """(frame count, fps), counting by demuxing video packets (container headers are often wrong)."""
    with _open(path) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
        count = sum(1 for packet in container.demux(stream) if packet.size)
    if count == 0:
        raise BadInputError(f"video {path} has no frames")
    return count, fps


def sample_frames(path: Path, frame_num: int) -> tuple[list[Image.Image], list[int], float, int]:
    """(frames, their indices, fps, total frames); frame_num −1 keeps every frame."""
    total, fps = video_info(path)
    wanted = list(range(total)) if frame_num == -1 else uniform_sample(total, min(frame_num, total))
    keep = set(wanted)
    frames: dict[int, Image.Image] = {}
    with _open(path) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in keep:
                frames[index] = frame.to_image()
            if index >= wanted[-1]:
                break
    present = [i for i in wanted if i in frames]
    return [frames[i] for i in present], present, fps, total


def write_video(path: Path, frames: list[Image.Image], fps: int) -> None:
    """MPEG-4 part 2 (ffmpeg's own encoder, present in every PyAV build) — used for the synthetic fixtures."""
    try:
        import av
    except ImportError:
        raise ResourceError("writing videos needs PyAV", "pip install av") from None
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_image(image.convert("RGB"))):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
