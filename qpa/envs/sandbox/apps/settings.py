"""Settings: system toggles, display, sound, Wi-Fi, Bluetooth, Do Not Disturb, permissions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import CLOCK_24H, ISO_MINUTE, App, fail, tool

WEEK = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
ClockTime = Annotated[str, Field(pattern=CLOCK_24H, description="Time of day, HH:MM (24-hour)")]
Toggle = Literal[
    "wifi",
    "bluetooth",
    "airplane_mode",
    "dark_mode",
    "auto_brightness",
    "battery_saver",
    "location_services",
]
Stream = Literal["ring", "media", "alarm", "notification"]
Permission = Literal["camera", "location", "microphone", "contacts", "notifications", "photos"]
RINGTONES = (
    "Opening",
    "Chimes",
    "Marimba",
    "Pixel Bells",
    "Ripples",
    "Beacon",
    "Silk",
    "Old Phone",
)
Ringtone = Literal[
    "Opening", "Chimes", "Marimba", "Pixel Bells", "Ripples", "Beacon", "Silk", "Old Phone"
]
DeviceId = Annotated[str, Field(min_length=1, description="Bluetooth device id, e.g. bt_101")]

DEFAULT_SYSTEM: dict[str, Any] = {
    "wifi": True,
    "wifi_network": None,
    "bluetooth": False,
    "airplane_mode": False,
    "brightness": 50,
    "auto_brightness": True,
    "dark_mode": False,
    "battery_saver": False,
    "location_services": True,
    "do_not_disturb": False,
    "dnd_until": None,
    "ring_volume": 6,
    "media_volume": 6,
    "alarm_volume": 7,
    "notification_volume": 5,
    "screen_timeout_s": 60,
    "font_size": "default",
    "ringtone": "Opening",
}


class SystemSettings(TypedDict):
    wifi: bool
    wifi_network: str | None
    bluetooth: bool
    airplane_mode: bool
    brightness: int
    auto_brightness: bool
    dark_mode: bool
    battery_saver: bool
    location_services: bool
    do_not_disturb: bool
    dnd_until: str | None
    ring_volume: int
    media_volume: int
    alarm_volume: int
    notification_volume: int
    screen_timeout_s: int
    font_size: str
    ringtone: str


class WifiNetwork(TypedDict):
    ssid: str
    secured: bool
    saved: bool
    connected: bool
    signal: int


class BluetoothDevice(TypedDict):
    id: str
    name: str
    kind: str
    paired: bool
    connected: bool
    in_range: bool


class DndSchedule(TypedDict):
    id: str
    name: str
    start: str
    end: str
    days: list[str]
    allow_favorites: bool
    enabled: bool


class AppPermission(TypedDict):
    id: str
    app: str
    permission: str
    granted: bool


class Removed(TypedDict):
    removed: str


def system_record(**overrides: Any) -> dict[str, Any]:
    """The system settings dict of a task world (defaults plus overrides)."""
    unknown = set(overrides) - set(DEFAULT_SYSTEM)
    if unknown:
        raise KeyError(f"unknown settings: {sorted(unknown)}")
    return {**DEFAULT_SYSTEM, **overrides}


def wifi_record(
    net_id: str,
    ssid: str,
    *,
    secured: bool = True,
    password: str = "",
    saved: bool = False,
    signal: int = 3,
    in_range: bool = True,
) -> dict[str, Any]:
    return {
        "id": net_id,
        "ssid": ssid,
        "secured": secured,
        "password": password,
        "saved": saved,
        "connected": False,
        "signal": signal,
        "in_range": in_range,
    }


def bluetooth_record(
    dev_id: str,
    name: str,
    kind: str,
    *,
    paired: bool = True,
    connected: bool = False,
    in_range: bool = True,
) -> dict[str, Any]:
    return {
        "id": dev_id,
        "name": name,
        "kind": kind,
        "paired": paired,
        "connected": connected,
        "in_range": in_range,
    }


def permission_record(perm_id: str, app: str, permission: str, granted: bool) -> dict[str, Any]:
    return {"id": perm_id, "app": app, "permission": permission, "granted": granted}


def _week_order(days: list[str]) -> list[str]:
    return [d for d in WEEK if d in set(days)]


class SettingsApp(App):
    name = "settings"
    title = "Settings"
    description = (
        "System settings: Wi-Fi, Bluetooth, airplane mode, display, sounds, Do Not Disturb "
        "schedules and app permissions."
    )
    skills = {
        "brightness": (
            "While auto_brightness is on the system sets the level itself and "
            "settings_set_brightness is refused: first call settings_toggle(setting="
            "'auto_brightness', enabled=false), then settings_set_brightness(level)."
        ),
        "join_wifi": (
            "Scanning (settings_list_wifi_networks) and joining need Wi-Fi on: "
            "settings_toggle('wifi', true) first if it is off. A saved network joins without a "
            "password. For a secured network that is not saved, the password is in the Notes "
            "app: the user keeps a note titled 'Wi-Fi passwords' with one 'SSID: password' line "
            "per network — read it with notes_search; never guess a password."
        ),
        "bluetooth": (
            "Bluetooth devices need Bluetooth on (settings_toggle). A device must be paired "
            "(settings_pair_bluetooth) before settings_connect_bluetooth; connecting an audio "
            "device disconnects the other audio device."
        ),
        "do_not_disturb": (
            "Recurring quiet hours are a DND schedule (settings_create_dnd_schedule) with days "
            "as 3-letter codes ('every night' = all seven, 'school nights' = sun-thu); a "
            "schedule may end the next morning (start 23:00, end 07:00). "
            "settings_set_do_not_disturb is only for 'right now'."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "system": dict(DEFAULT_SYSTEM),
            "wifi_networks": [],
            "bluetooth_devices": [],
            "dnd_schedules": [],
            "app_permissions": [],
        }

    # helpers ----------------------------------------------------------------------------
    def _system(self) -> dict[str, Any]:
        system: dict[str, Any] = self.state.setdefault("system", {})
        for key, value in DEFAULT_SYSTEM.items():
            system.setdefault(key, value)
        return system

    def _snapshot(self) -> SystemSettings:
        return cast(SystemSettings, dict(self._system()))

    def _network(self, ssid: str) -> dict[str, Any]:
        for net in self.records("wifi_networks"):
            if net.get("ssid") == ssid:
                return net
        raise fail(f"Wi-Fi network '{ssid}' not found; scan with settings_list_wifi_networks")

    def _device(self, device_id: str) -> dict[str, Any]:
        if not self._system()["bluetooth"]:
            raise fail("Bluetooth is off; turn it on with settings_toggle")
        return self.find("bluetooth_devices", device_id, what="Bluetooth device")

    @staticmethod
    def _public(net: dict[str, Any]) -> WifiNetwork:
        return {
            "ssid": net["ssid"],
            "secured": bool(net.get("secured")),
            "saved": bool(net.get("saved")),
            "connected": bool(net.get("connected")),
            "signal": int(net.get("signal", 0)),
        }

    def _disconnect_wifi(self) -> None:
        self._system()["wifi_network"] = None
        for net in self.records("wifi_networks"):
            net["connected"] = False

    # reads ------------------------------------------------------------------------------
    @tool()
    def settings_get_all(self) -> SystemSettings:
        """Read every system setting: toggles, brightness, volumes, screen timeout, Wi-Fi."""
        return self._snapshot()

    @tool()
    def settings_list_wifi_networks(self) -> list[WifiNetwork]:
        """Scan for Wi-Fi networks in range (needs Wi-Fi on); saved ones are marked."""
        if not self._system()["wifi"]:
            raise fail("Wi-Fi is off; turn it on with settings_toggle to scan")
        nets = [n for n in self.records("wifi_networks") if n.get("in_range", True)]
        nets.sort(key=lambda n: -int(n.get("signal", 0)))
        return [self._public(n) for n in nets]

    @tool()
    def settings_list_bluetooth_devices(self) -> list[BluetoothDevice]:
        """List paired and nearby Bluetooth devices (needs Bluetooth on)."""
        if not self._system()["bluetooth"]:
            raise fail("Bluetooth is off; turn it on with settings_toggle")
        return cast(list[BluetoothDevice], self.records("bluetooth_devices"))

    @tool()
    def settings_list_dnd_schedules(self) -> list[DndSchedule]:
        """List the Do Not Disturb schedules."""
        return cast(list[DndSchedule], self.records("dnd_schedules"))

    @tool()
    def settings_list_app_permissions(
        self,
        app: Annotated[str | None, Field(min_length=1)] = None,
        permission: Permission | None = None,
        granted_only: bool = False,
    ) -> list[AppPermission]:
        """List which apps asked for which permissions and whether they were granted."""
        rows = [
            p
            for p in self.records("app_permissions")
            if (app is None or str(p.get("app", "")).lower() == app.lower())
            and (permission is None or p.get("permission") == permission)
            and (not granted_only or p.get("granted"))
        ]
        return cast(list[AppPermission], rows)

    # writes -----------------------------------------------------------------------------
    @tool("write")
    def settings_toggle(self, setting: Toggle, enabled: bool) -> SystemSettings:
        """Turn a system switch on or off. Airplane mode also turns Wi-Fi and Bluetooth off."""
        system = self._system()
        system[setting] = enabled
        if setting == "airplane_mode" and enabled:
            system["wifi"] = system["bluetooth"] = False
        if not system["wifi"]:
            self._disconnect_wifi()
        if not system["bluetooth"]:
            for dev in self.records("bluetooth_devices"):
                dev["connected"] = False
        if setting == "battery_saver" and enabled and system["screen_timeout_s"] > 60:
            system["screen_timeout_s"] = 60
        return self._snapshot()

    @tool("write")
    def settings_set_brightness(
        self, level: Annotated[int, Field(ge=0, le=100, description="Percent")]
    ) -> SystemSettings:
        """Set the screen brightness in percent (auto-brightness must be off)."""
        system = self._system()
        if system["auto_brightness"]:
            raise fail("auto-brightness is on and controls the level; turn it off first")
        system["brightness"] = level
        return self._snapshot()

    @tool("write")
    def settings_set_volume(
        self, stream: Stream, level: Annotated[int, Field(ge=0, le=10)]
    ) -> SystemSettings:
        """Set the volume (0-10) of the ring, media, alarm or notification stream."""
        if stream == "alarm" and level == 0:
            raise fail(
                "argument 'level': the alarm volume cannot be 0 (minimum 1)", "invalid_arguments"
            )
        self._system()[f"{stream}_volume"] = level
        return self._snapshot()

    @tool("write")
    def settings_set_screen_timeout(
        self, seconds: Literal[15, 30, 60, 120, 300, 600]
    ) -> SystemSettings:
        """Set how long the screen stays on without a touch."""
        system = self._system()
        if system["battery_saver"] and seconds > 60:
            raise fail("battery saver limits the screen timeout to 60 s; turn it off first")
        system["screen_timeout_s"] = seconds
        return self._snapshot()

    @tool("write")
    def settings_set_font_size(
        self, size: Literal["small", "default", "large", "largest"]
    ) -> SystemSettings:
        """Set the system font size."""
        self._system()["font_size"] = size
        return self._snapshot()

    @tool("write")
    def settings_set_ringtone(self, sound: Ringtone) -> SystemSettings:
        """Set the ringtone for incoming calls."""
        self._system()["ringtone"] = sound
        return self._snapshot()

    @tool("write")
    def settings_set_do_not_disturb(
        self,
        enabled: bool,
        until: Annotated[
            str | None, Field(pattern=ISO_MINUTE, description="YYYY-MM-DDTHH:MM")
        ] = None,
    ) -> SystemSettings:
        """Turn Do Not Disturb on now (optionally until a time) or off."""
        system = self._system()
        if until is not None:
            if not enabled:
                raise fail(
                    "argument 'until': only for turning Do Not Disturb on", "invalid_arguments"
                )
            try:
                moment = datetime.fromisoformat(until)
            except ValueError:
                raise fail(
                    f"argument 'until': {until!r} is not a real time", "invalid_arguments"
                ) from None
            if moment <= self.world.now:
                raise fail(f"until {until} is not in the future (now {self.world.iso_now()})")
        system["do_not_disturb"] = enabled
        system["dnd_until"] = until if enabled else None
        return self._snapshot()

    @tool("write")
    def settings_connect_wifi(
        self,
        ssid: Annotated[str, Field(min_length=1, max_length=64)],
        password: Annotated[str | None, Field(min_length=8, max_length=63)] = None,
    ) -> WifiNetwork:
        """Join a Wi-Fi network; secured networks that are not saved need the password."""
        if not self._system()["wifi"]:
            raise fail("Wi-Fi is off; turn it on with settings_toggle first")
        net = self._network(ssid)
        if not net.get("in_range", True):
            raise fail(f"'{ssid}' is out of range")
        if net.get("secured") and not net.get("saved"):
            if password is None:
                raise fail(f"'{ssid}' is secured; give its password")
            if password != net.get("password"):
                raise fail(f"incorrect password for '{ssid}'")
        self._disconnect_wifi()
        net["saved"] = True
        net["connected"] = True
        self._system()["wifi_network"] = ssid
        return self._public(net)

    @tool("write")
    def settings_forget_wifi(
        self, ssid: Annotated[str, Field(min_length=1, max_length=64)]
    ) -> WifiNetwork:
        """Forget a saved Wi-Fi network (disconnecting from it if connected)."""
        net = self._network(ssid)
        if not net.get("saved"):
            raise fail(f"'{ssid}' is not a saved network")
        if net.get("connected"):
            self._disconnect_wifi()
        net["saved"] = False
        return self._public(net)

    @tool("write")
    def settings_pair_bluetooth(self, device_id: DeviceId) -> BluetoothDevice:
        """Pair a nearby Bluetooth device that is in pairing mode."""
        dev = self._device(device_id)
        if dev.get("paired"):
            raise fail(f"'{dev['name']}' is already paired")
        if not dev.get("in_range", True):
            raise fail(f"'{dev['name']}' is not in range or not in pairing mode")
        dev["paired"] = True
        return cast(BluetoothDevice, dev)

    @tool("write")
    def settings_connect_bluetooth(self, device_id: DeviceId) -> BluetoothDevice:
        """Connect a paired Bluetooth device (one audio device at a time)."""
        dev = self._device(device_id)
        if not dev.get("paired"):
            raise fail(f"'{dev['name']}' is not paired; pair it with settings_pair_bluetooth first")
        if not dev.get("in_range", True):
            raise fail(f"'{dev['name']}' is not in range")
        if dev.get("kind") in ("headphones", "speaker", "car"):
            for other in self.records("bluetooth_devices"):
                if other.get("kind") in ("headphones", "speaker", "car"):
                    other["connected"] = False
        dev["connected"] = True
        return cast(BluetoothDevice, dev)

    @tool("write")
    def settings_unpair_bluetooth(self, device_id: DeviceId) -> BluetoothDevice:
        """Forget a paired Bluetooth device."""
        dev = self._device(device_id)
        if not dev.get("paired"):
            raise fail(f"'{dev['name']}' is not paired")
        dev["paired"] = dev["connected"] = False
        return cast(BluetoothDevice, dev)

    @tool("write")
    def settings_create_dnd_schedule(
        self,
        start: ClockTime,
        end: ClockTime,
        days: Annotated[list[Day], Field(min_length=1, description="3-letter day codes")],
        name: Annotated[str, Field(min_length=1, max_length=40)] = "Sleep",
        allow_favorites: bool = False,
    ) -> DndSchedule:
        """Create a recurring Do Not Disturb schedule from start to end (may cross midnight)
        on the given days; favourites' calls can be let through."""
        if start == end:
            raise fail("argument 'end': must differ from start", "invalid_arguments")
        if any(
            str(s.get("name", "")).lower() == name.lower() for s in self.records("dnd_schedules")
        ):
            raise fail(f"a schedule named '{name}' already exists; delete it first")
        record: DndSchedule = {
            "id": self.world.new_id("dnd"),
            "name": name,
            "start": start,
            "end": end,
            "days": _week_order(list(days)),
            "allow_favorites": allow_favorites,
            "enabled": True,
        }
        self.records("dnd_schedules").append(dict(record))
        return record

    @tool("write")
    def settings_delete_dnd_schedule(
        self, schedule_id: Annotated[str, Field(min_length=1)]
    ) -> Removed:
        """Delete a Do Not Disturb schedule."""
        record = self.find("dnd_schedules", schedule_id, what="schedule")
        self.records("dnd_schedules").remove(record)
        return {"removed": schedule_id}

    @tool("write")
    def settings_set_app_permission(
        self, app: Annotated[str, Field(min_length=1)], permission: Permission, granted: bool
    ) -> AppPermission:
        """Grant or revoke a permission an app has asked for."""
        for row in self.records("app_permissions"):
            if (
                str(row.get("app", "")).lower() == app.lower()
                and row.get("permission") == permission
            ):
                row["granted"] = granted
                return cast(AppPermission, row)
        raise fail(f"{app} has never asked for {permission} access")
