"""`qpa device`: the DevicePool bridge and phone discovery; device options of other commands.

    qpa device list --adb 127.0.0.1:5037          # attached phones: serial, state, model, Android
    qpa device bridge --spec /etc/qpa/order/workorder.yaml   # what a DevicePool's bridge pod runs
    qpa device bridge --pool lab-phones --config devicepool.yaml --adb-port 5037  # by hand

`device_env_options` turns `--serial/--adb` or `--device-pool` into the options of a device
environment (`qpa run --env device`, `qpa env serve --kind device`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from qpa.cli import app
from qpa.cli.common import console, die, err_console, print_json

device_app = typer.Typer(help="Phones over adb: the DevicePool bridge and discovery.")
app.add_typer(device_app, name="device", no_args_is_help=True)


def device_env_options(
    *,
    serial: str | None,
    adb: str | None,
    device_pool: str | None,
    namespace: str | None = None,
    acquire_timeout: float = 30.0,
    kubeconfig: Path | None = None,
) -> dict[str, Any]:
    """Options of a device environment: one named phone, or leases from a DevicePool."""
    try:
        from qpa.device.leases import LeasedPhones
        from qpa.envs.device import FixedPhone, parse_address
    except ImportError as exc:
        die(f"the device environment needs the `device` extra (pip install 'qpa[device]'): {exc}")

    if serial and device_pool:
        die("give --serial (one phone) or --device-pool (lease from a pool), not both")
    if serial:
        try:
            return {"phones": FixedPhone(serial, adb) if adb else FixedPhone(serial)}
        except ValueError as exc:
            die(f"--adb: {exc}")
    if not device_pool:
        die("a device environment needs --serial (and --adb HOST:PORT) or --device-pool NAME")
    if adb:
        try:
            parse_address(adb)
        except ValueError as exc:
            die(f"--adb: {exc}")
    from qpa.device.kube import Kube, KubeError

    try:
        kube = Kube.connect(namespace, str(kubeconfig) if kubeconfig else None)
    except KubeError as exc:
        die(str(exc))
    return {
        "phones": LeasedPhones(kube, device_pool, adb_fallback=adb, acquire_timeout=acquire_timeout)
    }


def load_pool_spec(path: Path) -> Any:
    """The DevicePoolSpec in a bridge config file (the ConfigMap's wire form)."""
    from qpa.api.v1alpha1 import DevicePoolSpec

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        die(f"--config {path}: {exc}")
    try:
        return DevicePoolSpec.model_validate(data if data is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<spec>'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        die(f"--config {path}: invalid DevicePool spec: {problems}")


@device_app.command("list")
def list_command(
    adb: Annotated[str, typer.Option(help="adb server HOST:PORT.")] = "127.0.0.1:5037",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the phones an adb server sees, with model and Android version."""
    from qpa.envs.device import AdbPhone, AdbServerClient, DeviceError, parse_address

    try:
        host, port = parse_address(adb)
    except ValueError as exc:
        die(f"--adb: {exc}")
    client = AdbServerClient(host, port)
    try:
        states = client.states()
    except DeviceError as exc:
        die(str(exc), code=1)
    rows = []
    for serial, state in sorted(states.items()):
        row = {"serial": serial, "state": state, "model": None, "android_version": None}
        if state == "device":
            try:
                text = AdbPhone(serial, client=client, timeout=10).check(
                    "getprop ro.product.model; getprop ro.build.version.release"
                )
                lines = [*text.splitlines(), "", ""]
                row["model"], row["android_version"] = lines[0].strip(), lines[1].strip()
            except DeviceError as exc:
                row["state"] = f"{state} ({exc})"
        rows.append(row)
    if json_out:
        print_json(rows)
        return
    for row in rows:
        console.print(
            f"{row['serial']}\t{row['state']}\t{row['model'] or '-'}\t"
            f"{row['android_version'] or '-'}",
            highlight=False,
        )


@device_app.command("bridge")
def bridge_command(
    node: Annotated[str, typer.Option(envvar="NODE_NAME", help="Node the phones are attached to.")],
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The DevicePool's work order (what the bridge pods run): pool, spec and adb "
            "port come from it, the pod's address from $POD_IP; other pods reach the adb server "
            "only through the adb gate on $POD_IP, which admits the pool's env servers.",
        ),
    ] = None,
    pool: Annotated[
        str | None, typer.Option(envvar="QPA_DEVICE_POOL", help="DevicePool this bridge serves.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="The pool's spec as YAML (without --spec).")
    ] = None,
    adb_port: Annotated[int, typer.Option(min=1, max=65535, help="adb server port.")] = 5037,
    adb_host: Annotated[str, typer.Option(help="adb server host.")] = "127.0.0.1",
    namespace: Annotated[
        str | None, typer.Option(envvar="POD_NAMESPACE", help="Namespace of the pool.")
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="HOST:PORT other pods reach this adb server at (leases carry it)."),
    ] = None,
    connect: Annotated[
        list[str] | None,
        typer.Option(help="Network phone to `adb connect` (and reconnect); repeatable."),
    ] = None,
    start_adb: Annotated[
        bool, typer.Option(help="Start the adb server when none answers on the port.")
    ] = True,
    scan_seconds: Annotated[float, typer.Option(min=0.05, help="Seconds between scans.")] = 5.0,
    once: Annotated[bool, typer.Option(help="Scan once, print the phones as JSON, exit.")] = False,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Kubeconfig (default: in-cluster or ~/.kube/config).")
    ] = None,
) -> None:
    """Publish this node's phones to the DevicePool: Leases, health, quarantine, status."""
    from qpa.api.v1alpha1 import DevicePool, WorkOrder, WorkOrderError
    from qpa.device.bridge import AdbServerProcess, Bridge, BridgeSettings
    from qpa.device.kube import Kube, KubeError
    from qpa.device.proxy import AdbGate, AllowedPeers, client_selector, pod_addresses
    from qpa.envs.device import DeviceError, parse_address

    if spec_file is not None:
        try:
            order = WorkOrder.load(spec_file, DevicePool)
        except WorkOrderError as exc:
            die(str(exc))
        base = BridgeSettings.from_devicepool(order, node=node, pod_ip=os.environ.get("POD_IP"))
        settings = dataclasses.replace(base, connect=tuple(connect or ()))
    else:
        if pool is None or config is None:
            die("give --spec (a DevicePool work order), or --pool and --config")
        settings = BridgeSettings(
            pool=pool,
            node=node,
            spec=load_pool_spec(config),
            adb_host=adb_host,
            adb_port=adb_port,
            advertise=advertise,
            connect=tuple(connect or ()),
            namespace=namespace,
        )
    for address in [*settings.connect, *([settings.advertise] if settings.advertise else [])]:
        try:
            parse_address(address)
        except ValueError as exc:
            die(str(exc))
    logging.basicConfig(
        level=os.environ.get("QPA_LOG_LEVEL", "INFO"), format="%(levelname)s %(name)s %(message)s"
    )
    try:
        kube = Kube.connect(settings.namespace, str(kubeconfig) if kubeconfig else None)
    except KubeError as exc:
        die(str(exc))
    adb_port, pool = settings.adb_port, settings.pool
    server = AdbServerProcess(adb_port) if start_adb else None
    bridge = Bridge(settings, kube)
    gate = None
    if settings.gate is not None:
        selector = client_selector(pool)
        allowed = AllowedPeers(lambda: pod_addresses(kube.list_pods(selector)))
        try:
            gate = AdbGate(settings.gate, (adb_host, adb_port), allowed).start()
        except OSError as exc:
            die(f"adb gate on {settings.gate[0]}:{settings.gate[1]}: {exc}", code=1)
    try:
        if once:
            if server is not None:
                server.ensure()
            report = bridge.scan()
            print_json([p.to_k8s() for p in report.phones])
            return
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        err_console.print(
            f"qpa device bridge: pool {pool} on node {node}, adb {adb_host}:{adb_port}",
            highlight=False,
        )
        bridge.run(stop, scan_seconds, server)
    except (KubeError, DeviceError) as exc:
        die(str(exc), code=1)
    finally:
        if gate is not None:
            gate.close()
        if server is not None:
            server.stop()
        kube.close()
