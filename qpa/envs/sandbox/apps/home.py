"""Smart home: rooms with lights, plugs, thermostats, door locks and cameras; scenes, security."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import ISO_MINUTE, App, Limit, Offset, ToolError, fail, paginate, tool

PIN = r"^[0-9]{4,8}$"

DeviceType = Literal["light", "thermostat", "lock", "camera", "plug"]
ThermostatMode = Literal["heat", "cool", "auto", "eco", "off"]
LightColor = Literal["warm", "neutral", "cool", "red", "green", "blue", "purple"]
SecurityMode = Literal["disarmed", "home", "away"]
EventKind = Literal["motion", "person", "package", "vehicle"]
SceneCommand = Literal["on", "off", "lock", "set_mode", "set_temperature"]


class Room(TypedDict):
    name: str
    floor: int
    devices: int


class Device(TypedDict):
    id: str
    name: str
    room: str
    type: DeviceType
    online: bool
    on: NotRequired[bool]
    brightness: NotRequired[int]
    color: NotRequired[LightColor]
    mode: NotRequired[ThermostatMode]
    target_c: NotRequired[float]
    current_c: NotRequired[float]
    min_c: NotRequired[float]
    max_c: NotRequired[float]
    locked: NotRequired[bool]
    jammed: NotRequired[bool]
    battery: NotRequired[int]
    recording: NotRequired[bool]
    motion_alerts: NotRequired[bool]


class RoomLights(TypedDict):
    room: str
    changed: list[str]
    skipped_offline: list[str]


class SceneAction(TypedDict):
    device_id: str
    command: SceneCommand
    value: NotRequired[str | float | None]


class Scene(TypedDict):
    id: str
    name: str
    actions: list[SceneAction]
    last_run: str | None


class SceneRun(TypedDict):
    scene_id: str
    executed: int
    time: str


class Security(TypedDict):
    mode: SecurityMode
    changed: str | None


class CameraEvent(TypedDict):
    id: str
    camera_id: str
    kind: EventKind
    time: str
    description: str


class GuestCode(TypedDict):
    id: str
    lock_id: str
    guest_name: str
    code: str
    valid_from: str
    valid_until: str
    active: bool


class HomeApp(App):
    name = "home"
    title = "Home"
    description = (
        "Smart home control: rooms, lights, plugs, thermostats, door locks, cameras, scenes, "
        "security modes and guest access codes."
    )
    skills = {
        "away_mode": (
            "There is no single 'away' switch. 'Away mode' = a scene named 'Away' whose actions "
            "are, in this order: lock every door lock, set every thermostat to mode 'eco', turn "
            "every light off. Create it with home_create_scene (if it does not exist yet), run it "
            "with home_run_scene, then arm security with home_set_security(mode='away', pin). "
            "Security refuses to arm 'away' while any lock is unlocked."
        ),
        "thermostat_modes": (
            "A thermostat in 'eco' or 'off' mode ignores target changes: first switch it with "
            "home_set_thermostat_mode to 'heat' (target above the current temperature), 'cool' "
            "(below) or 'auto', then home_set_thermostat. Targets outside the device's "
            "min_c..max_c are rejected."
        ),
        "jammed_lock": (
            "If a lock reports 'door lock jammed', call home_recalibrate_lock on it (the bolt "
            "retracts, leaving it unlocked), then home_lock again. Do not retry home_lock first."
        ),
        "guest_access": (
            "Never share the master PIN. For visitors create a time-limited code with "
            "home_create_guest_code(lock_id, guest_name, code, valid_from, valid_until) using ISO "
            "times, then send the code (not the PIN) to the guest."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "rooms": [],
            "devices": [],
            "scenes": [],
            "camera_events": [],
            "guest_codes": [],
            "security": {"mode": "disarmed", "changed": None},
            "settings": {"pin": "0000"},
        }

    # ------------------------------------------------------------------ helpers
    def _device(self, device_id: str, kind: str | None = None) -> dict[str, Any]:
        device = self.find("devices", device_id, what="device")
        if kind is not None and device["type"] != kind:
            raise fail(f"'{device['name']}' is a {device['type']}, not a {kind}")
        return device

    def _online(self, device: dict[str, Any]) -> None:
        if not device.get("online", True):
            raise fail(f"device offline: '{device['name']}' is not responding")

    def _room(self, room: str) -> str:
        for r in self.records("rooms"):
            if r["name"].lower() == room.lower():
                name: str = r["name"]
                return name
        names = ", ".join(r["name"] for r in self.records("rooms"))
        raise fail(f"unknown room '{room}'; rooms: {names}")

    def _check_pin(self, pin: str) -> None:
        if pin != self.state["settings"]["pin"]:
            raise fail("wrong PIN", "permission_denied")

    def _lock(self, device: dict[str, Any]) -> None:
        self._online(device)
        if device.get("jammed"):
            raise fail(f"door lock jammed: '{device['name']}' could not throw its bolt")
        device["locked"] = True

    def _set_temperature(self, device: dict[str, Any], target: float) -> None:
        self._online(device)
        if device["mode"] in ("eco", "off"):
            raise fail(
                f"'{device['name']}' is in {device['mode']} mode and ignores targets; "
                "change its mode first"
            )
        if not device["min_c"] <= target <= device["max_c"]:
            raise fail(
                f"temperature out of range: {target} °C; '{device['name']}' accepts "
                f"{device['min_c']}-{device['max_c']} °C"
            )
        device["target_c"] = target

    def _switch(self, device: dict[str, Any], on: bool) -> None:
        if device["type"] not in ("light", "plug"):
            raise fail(f"'{device['name']}' is a {device['type']} and cannot be switched")
        self._online(device)
        device["on"] = on

    # ------------------------------------------------------------------ browsing
    @tool()
    def home_list_rooms(self) -> list[Room]:
        """List rooms with their floor and number of devices."""
        out: list[Room] = []
        for r in self.records("rooms"):
            count = sum(1 for d in self.records("devices") if d["room"] == r["name"])
            out.append({"name": r["name"], "floor": r.get("floor", 0), "devices": count})
        return out

    @tool()
    def home_list_devices(
        self,
        room: str | None = None,
        type: DeviceType | None = None,
        online_only: bool = False,
    ) -> list[Device]:
        """List devices with their current state, optionally by room and type."""
        name = self._room(room) if room is not None else None
        rows = [
            d
            for d in self.records("devices")
            if (name is None or d["room"] == name)
            and (type is None or d["type"] == type)
            and (not online_only or d.get("online", True))
        ]
        return cast(list[Device], rows)

    @tool()
    def home_get_device(self, device_id: str) -> Device:
        """One device and its current state."""
        return cast(Device, self._device(device_id))

    # ------------------------------------------------------------------ control
    @tool("write")
    def home_set_light(
        self,
        device_id: str,
        on: bool,
        brightness: Annotated[int | None, Field(ge=1, le=100, description="Percent")] = None,
        color: LightColor | None = None,
    ) -> Device:
        """Switch a light on or off, optionally with brightness (1-100 %) and color."""
        device = self._device(device_id, "light")
        self._online(device)
        device["on"] = on
        if brightness is not None:
            device["brightness"] = brightness
        if color is not None:
            device["color"] = color
        return cast(Device, device)

    @tool("write")
    def home_set_room_lights(
        self,
        room: str,
        on: bool,
        brightness: Annotated[int | None, Field(ge=1, le=100)] = None,
    ) -> RoomLights:
        """Switch all lights of a room at once; offline lights are skipped and reported."""
        name = self._room(room)
        changed: list[str] = []
        skipped: list[str] = []
        for d in self.records("devices"):
            if d["room"] != name or d["type"] != "light":
                continue
            if not d.get("online", True):
                skipped.append(d["id"])
                continue
            d["on"] = on
            if brightness is not None:
                d["brightness"] = brightness
            changed.append(d["id"])
        if not changed and not skipped:
            raise fail(f"there are no lights in the {name}")
        return {"room": name, "changed": changed, "skipped_offline": skipped}

    @tool("write")
    def home_set_plug(self, device_id: str, on: bool) -> Device:
        """Switch a smart plug on or off."""
        device = self._device(device_id, "plug")
        self._switch(device, on)
        return cast(Device, device)

    @tool("write")
    def home_set_thermostat(
        self,
        device_id: str,
        target_c: Annotated[float, Field(ge=-10, le=50, description="Target temperature in °C")],
    ) -> Device:
        """Set a thermostat's target temperature (°C)."""
        device = self._device(device_id, "thermostat")
        self._set_temperature(device, target_c)
        return cast(Device, device)

    @tool("write")
    def home_set_thermostat_mode(self, device_id: str, mode: ThermostatMode) -> Device:
        """Change a thermostat's mode: heat, cool, auto, eco (energy saving) or off."""
        device = self._device(device_id, "thermostat")
        self._online(device)
        device["mode"] = mode
        return cast(Device, device)

    @tool("write")
    def home_lock(self, device_id: str) -> Device:
        """Lock a door lock."""
        device = self._device(device_id, "lock")
        self._lock(device)
        return cast(Device, device)

    @tool("write")
    def home_unlock(
        self, device_id: str, pin: Annotated[str, Field(pattern=PIN, description="Master PIN")]
    ) -> Device:
        """Unlock a door lock (needs the master PIN)."""
        device = self._device(device_id, "lock")
        self._online(device)
        self._check_pin(pin)
        if device.get("jammed"):
            raise fail(f"door lock jammed: '{device['name']}' could not retract its bolt")
        device["locked"] = False
        return cast(Device, device)

    @tool("write")
    def home_recalibrate_lock(self, device_id: str) -> Device:
        """Recalibrate a jammed lock: the bolt retracts and the lock is left unlocked."""
        device = self._device(device_id, "lock")
        self._online(device)
        device["jammed"] = False
        device["locked"] = False
        return cast(Device, device)

    @tool("write")
    def home_set_camera(
        self, device_id: str, recording: bool | None = None, motion_alerts: bool | None = None
    ) -> Device:
        """Turn a camera's recording and/or motion alerts on or off."""
        device = self._device(device_id, "camera")
        self._online(device)
        if recording is None and motion_alerts is None:
            raise fail("give recording and/or motion_alerts", "invalid_arguments")
        if recording is not None:
            device["recording"] = recording
        if motion_alerts is not None:
            device["motion_alerts"] = motion_alerts
        return cast(Device, device)

    @tool()
    def home_camera_events(
        self,
        camera_id: str | None = None,
        kind: EventKind | None = None,
        after: Annotated[str | None, Field(pattern=ISO_MINUTE)] = None,
        before: Annotated[str | None, Field(pattern=ISO_MINUTE)] = None,
        limit: Limit = 20,
        offset: Offset = 0,
    ) -> list[CameraEvent]:
        """Camera detections (motion, person, package, vehicle), newest first."""
        if camera_id is not None:
            self._device(camera_id, "camera")
        rows = [
            e
            for e in self.records("camera_events")
            if (camera_id is None or e["camera_id"] == camera_id)
            and (kind is None or e["kind"] == kind)
            and (after is None or e["time"] >= after)
            and (before is None or e["time"] <= before)
        ]
        rows.sort(key=lambda e: e["time"], reverse=True)
        return cast(list[CameraEvent], paginate(rows, limit, offset))

    # ------------------------------------------------------------------ scenes & security
    @tool()
    def home_list_scenes(self) -> list[Scene]:
        """List saved scenes and their actions."""
        return cast(list[Scene], self.records("scenes"))

    @tool("write")
    def home_create_scene(
        self,
        name: Annotated[str, Field(min_length=1, max_length=40)],
        actions: Annotated[list[SceneAction], Field(min_length=1, max_length=30)],
    ) -> Scene:
        """Save a scene: an ordered list of device commands run together by home_run_scene.

        Commands: on/off (lights, plugs), lock (locks), set_mode (thermostats, value = mode),
        set_temperature (thermostats, value = °C). Scenes cannot unlock doors."""
        if any(s["name"].lower() == name.lower() for s in self.records("scenes")):
            raise fail(f"a scene named '{name}' already exists")
        allowed = {
            "on": ("light", "plug"),
            "off": ("light", "plug"),
            "lock": ("lock",),
            "set_mode": ("thermostat",),
            "set_temperature": ("thermostat",),
        }
        modes = ("heat", "cool", "auto", "eco", "off")
        stored: list[dict[str, Any]] = []
        for i, action in enumerate(actions, 1):
            device = self._device(action["device_id"])
            command = action["command"]
            value = action.get("value")
            if device["type"] not in allowed[command]:
                raise fail(f"action {i}: '{command}' does not apply to a {device['type']}")
            if command == "set_mode" and value not in modes:
                raise fail(f"action {i}: set_mode needs value in {', '.join(modes)}")
            if command == "set_temperature" and not isinstance(value, int | float):
                raise fail(f"action {i}: set_temperature needs a numeric value")
            stored.append({"device_id": device["id"], "command": command, "value": value})
        record = {"id": self.world.new_id("sc"), "name": name, "actions": stored, "last_run": None}
        self.records("scenes").append(record)
        return cast(Scene, record)

    @tool("write")
    def home_run_scene(self, scene_id: str) -> SceneRun:
        """Run a scene's actions in order; it stops at the first action that fails."""
        scene = self.find("scenes", scene_id, what="scene")
        for i, action in enumerate(scene["actions"], 1):
            try:
                device = self._device(action["device_id"])
                command = action["command"]
                if command in ("on", "off"):
                    self._switch(device, command == "on")
                elif command == "lock":
                    self._lock(device)
                elif command == "set_mode":
                    self._online(device)
                    device["mode"] = action["value"]
                else:
                    self._set_temperature(device, float(action["value"]))
            except ToolError as exc:
                raise fail(f"scene '{scene['name']}' stopped at action {i}: {exc.message}") from exc
        scene["last_run"] = self.world.iso_now()
        return {"scene_id": scene_id, "executed": len(scene["actions"]), "time": scene["last_run"]}

    @tool("write")
    def home_delete_scene(self, scene_id: str) -> Scene:
        """Delete a scene."""
        scene = self.find("scenes", scene_id, what="scene")
        self.records("scenes").remove(scene)
        return cast(Scene, scene)

    @tool("write")
    def home_set_security(
        self, mode: SecurityMode, pin: Annotated[str, Field(pattern=PIN, description="Master PIN")]
    ) -> Security:
        """Arm ('home' / 'away') or disarm the security system (needs the master PIN)."""
        self._check_pin(pin)
        if mode == "away":
            open_locks = [
                d["name"]
                for d in self.records("devices")
                if d["type"] == "lock" and not d.get("locked")
            ]
            if open_locks:
                raise fail(f"cannot arm away: unlocked: {', '.join(open_locks)}")
        security = self.state["security"]
        security.update({"mode": mode, "changed": self.world.iso_now()})
        return cast(Security, security)

    # ------------------------------------------------------------------ guest access
    @tool("write")
    def home_create_guest_code(
        self,
        lock_id: str,
        guest_name: Annotated[str, Field(min_length=1, max_length=60)],
        code: Annotated[str, Field(pattern=r"^[0-9]{6}$", description="6-digit code")],
        valid_from: Annotated[str, Field(pattern=ISO_MINUTE)],
        valid_until: Annotated[str, Field(pattern=ISO_MINUTE)],
    ) -> GuestCode:
        """Create a time-limited access code for one lock."""
        device = self._device(lock_id, "lock")
        self._online(device)
        if valid_until <= valid_from:
            raise fail("valid_until must be after valid_from")
        if valid_until <= self.world.iso_now():
            raise fail(f"the period ends in the past (now {self.world.iso_now()})")
        if code == self.state["settings"]["pin"]:
            raise fail("a guest code must differ from the master PIN", "permission_denied")
        codes = self.records("guest_codes")
        if any(c["code"] == code and c["lock_id"] == lock_id and c["active"] for c in codes):
            raise fail(f"code {code} is already in use on '{device['name']}'")
        record: GuestCode = {
            "id": self.world.new_id("gc"),
            "lock_id": lock_id,
            "guest_name": guest_name,
            "code": code,
            "valid_from": valid_from,
            "valid_until": valid_until,
            "active": True,
        }
        codes.append(dict(record))
        return record

    @tool()
    def home_list_guest_codes(self, lock_id: str | None = None) -> list[GuestCode]:
        """List guest access codes (optionally for one lock)."""
        return cast(list[GuestCode], self.select("guest_codes", lock_id=lock_id))

    @tool("write")
    def home_revoke_guest_code(self, code_id: str) -> GuestCode:
        """Deactivate a guest access code."""
        record = self.find("guest_codes", code_id, what="guest code")
        if not record["active"]:
            raise fail(f"guest code {code_id} is already revoked")
        record["active"] = False
        return cast(GuestCode, record)
