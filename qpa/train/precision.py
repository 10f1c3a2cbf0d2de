"""Where bfloat16 pays: the one place `bf16: auto` is decided for a device.

bf16 autocast is about 2x faster than fp32 on a CPU that computes bfloat16 natively (AVX-512
BF16, AMX) and on CUDA GPUs with bf16; on an AVX2-only CPU torch emulates it and the same tiny
model trains about 9x *slower* than in fp32 (measured on one AVX2 core: 4.5 s against 0.5 s a
step of the induction warm-up). So `auto` turns it on only where the hardware has it.
"""

from __future__ import annotations

from typing import Literal

Bf16Setting = bool | Literal["auto"]


def cpu_has_native_bf16() -> bool:
    """True where this CPU has AMX tiles or AVX-512 BF16 (torch's own probes)."""
    import torch

    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None and bool(check()):
            return True
    return False


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu", "cuda", ...) computes bfloat16 natively."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type == "cpu":
        return cpu_has_native_bf16()
    return False


def resolve_bf16(setting: Bf16Setting, device_type: str) -> bool:
    """`True`/`False` as given; `"auto"`: bf16 exactly where the device has it natively."""
    if setting == "auto":
        return native_bf16(device_type)
    return bool(setting)


__all__ = ["Bf16Setting", "cpu_has_native_bf16", "native_bf16", "resolve_bf16"]
