"""The device environment: a phone over adb behind the shared contract (see `env`)."""

from qpa.envs.device.adb import AdbPhone, AdbServerClient, DeviceError, parse_address
from qpa.envs.device.env import DeviceEnv
from qpa.envs.device.source import (
    FixedPhone,
    PhoneAddress,
    PhoneClaim,
    PhoneSource,
    PhoneUnavailable,
)
from qpa.envs.device.tasks import DEVICE_SUITE, device_tasks, get_device_task

__all__ = [
    "DEVICE_SUITE",
    "AdbPhone",
    "AdbServerClient",
    "DeviceEnv",
    "DeviceError",
    "FixedPhone",
    "PhoneAddress",
    "PhoneClaim",
    "PhoneSource",
    "PhoneUnavailable",
    "device_tasks",
    "get_device_task",
    "parse_address",
]
