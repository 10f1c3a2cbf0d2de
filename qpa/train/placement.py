"""Where a trainer puts its model, in what precision, and where the weights come from.

- **Device** (`choose_device`): an explicit setting (`cpu`, `cuda`, `cuda:N`) wins and is
  checked against what torch sees; `auto` (the default) is the GPU of this rank
  (`cuda:$LOCAL_RANK`) wherever CUDA is available and the CPU only where it is not, so a GPU
  node never trains on its CPU because a default said so.
- **dtype** (`choose_dtype`): an explicit `float32` / `bfloat16` wins; `auto` is bfloat16 on a
  CUDA device that supports it and float32 on the CPU. One exception, for correctness: a model
  whose optimizer keeps no float32 master weights (plain AdamW, no DeepSpeed bf16) is loaded in
  float32 and run under bf16 autocast, because AdamW on bfloat16 weights drops every update
  below bf16's resolution (~0.4% of the weight: a learning rate of 1e-6 would never move it).
  Frozen models (a KL reference) and DeepSpeed bf16 runs (fp32 master copy in the optimizer)
  get bfloat16 weights.
- **Model source** (`resolve_model_source`): a local folder, a store URI (`s3://`, `pvc://`,
  `file://`, `hf://`, see `qpa.store.resolve`) or a bare Hub repo id (`Qwen/Qwen3-0.6B`,
  `org/name@revision`), resolved with `huggingface_hub` (the Hub cache only, when
  `HF_HUB_OFFLINE` is set). What is none of these is a `ResolveError` naming the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from qpa.store import ResolveError, resolve_local
from qpa.train.config import ConfigError

__all__ = [
    "DEVICE_PATTERN",
    "DtypeSetting",
    "PlacementError",
    "choose_device",
    "choose_dtype",
    "is_hub_id",
    "resolve_model_source",
]

DtypeSetting = Literal["float32", "bfloat16", "auto"]
#: What a `device:` setting may say.
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s@]+)?$")


class PlacementError(ConfigError):
    """A device or dtype setting this machine cannot honour; the message names the field."""


def choose_device(
    setting: str | None = "auto",
    *,
    field: str = "device",
    environ: Mapping[str, str] | None = None,
) -> Any:
    """The `torch.device` to train on (see the module doc). `LOCAL_RANK` picks the GPU."""
    import torch

    env = os.environ if environ is None else environ
    value = (setting or "auto").strip().lower()
    if not re.match(DEVICE_PATTERN, value):
        raise PlacementError(f"{field}: {setting!r} is not auto, cpu, cuda or cuda:<index>")
    if value == "cpu" or (value == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PlacementError(f"{field}: {setting!r} asks for CUDA, but torch sees no CUDA device")
    count = torch.cuda.device_count()
    if ":" in value:
        index, source = int(value.split(":", 1)[1]), f"{field}: {setting!r}"
    else:
        raw = env.get("LOCAL_RANK", "0").strip() or "0"
        if not raw.isdigit():
            raise PlacementError(f"LOCAL_RANK {raw!r} is not a GPU index (for {field})")
        index, source = int(raw), f"{field}: {value} with LOCAL_RANK={raw}"
    if index >= count:
        raise PlacementError(f"{source} names GPU {index}, but this node has {count}")
    return torch.device("cuda", index)


def choose_dtype(
    setting: str | None,
    device: Any,
    *,
    fp32_master: bool = True,
    field: str = "model_dtype",
) -> Any:
    """The `torch.dtype` to load weights in (see the module doc).

    `fp32_master`: whether training keeps float32 master weights outside the model (DeepSpeed
    bf16), or nothing trains these weights (a frozen reference); False for plain AdamW.
    """
    import torch

    value = setting or "auto"
    if value == "float32":
        return torch.float32
    if value == "bfloat16":
        return torch.bfloat16
    if value != "auto":
        raise PlacementError(f"{field}: {setting!r} is not float32, bfloat16 or auto")
    kind = getattr(device, "type", str(device))
    if kind == "cuda" and fp32_master and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def is_hub_id(text: str) -> bool:
    """Whether `text` has the shape of a Hub repo id (`org/name`, optionally `@revision`)."""
    return bool(_HUB_ID.match(text)) and "--" not in text and ".." not in text


def resolve_model_source(
    location: str | Path,
    *,
    field: str = "model",
    cache_dir: str | Path | None = None,
) -> Path:
    """The local folder holding a model (or tokenizer) given as a path, a URI or a Hub id.

    A local path that exists wins over a Hub id of the same spelling. A Hub id is fetched with
    `huggingface_hub.snapshot_download` (below `cache_dir/hf` when given, else the Hub's own
    cache), from the cache only when `HF_HUB_OFFLINE` is set. Raises `ResolveError`.
    """
    text = str(location).strip()
    if isinstance(location, Path) or "://" in text or not text:
        return resolve_local(location, field=field, cache_dir=cache_dir)
    local = Path(text).expanduser()
    if local.exists():
        return local.absolute()
    if not is_hub_id(text):
        raise ResolveError(
            text,
            f"is neither a local folder ({local.absolute()} does not exist) nor a Hub repo id "
            "(org/name[@revision])",
            field=field,
        )
    try:
        return resolve_local(f"hf://{text}", field=field, cache_dir=cache_dir)
    except ResolveError as exc:
        raise ResolveError(
            text,
            f"no local folder {local.absolute()}, and as a Hub repo id: {exc.detail}",
            field=field,
        ) from None
