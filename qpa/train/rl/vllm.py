"""The trainer's rollout client: TRL's vLLM server mode over HTTP, and weight sync every step.

TRL 1.16's `trl vllm-serve` runs vLLM's own OpenAI-compatible server in dev mode
(`VLLM_SERVER_DEV_MODE=1`, `--weight-transfer-config '{"backend": "nccl"}'`,
`--logprobs-mode processed_logprobs`); `RolloutClient` speaks exactly the API TRL's
`VLLMClient` uses against it:

- `GET /health` (waited for with tenacity until `timeout_s`), `GET /v1/models` (the served
  model's name), `GET /server_info?config_format=json` (`vllm_config.weight_transfer_config`:
  which communicator backend the server has), `GET /get_world_size` (its workers);
- `POST /v1/completions` with token-id prompts, `return_token_ids` and
  `return_tokens_as_token_ids`, `logprobs: 0`: each choice's sampled `token_ids` and the
  sampler's log-probability of each (`logprobs.token_logprobs`, after temperature: the
  distribution the trainer's loss compares against, for truncated importance sampling);
- weight sync: `POST /init_weight_transfer_engine` (`init_info`: the trainer is rank 0 of a
  group of `1 + world_size` ranks, the rendezvous at `master_address:master_port` on the
  trainer's side), then per step `POST /start_weight_update`, `POST /update_weights`
  (`update_info`: names, dtypes, shapes, in the order they are broadcast) while the trainer
  broadcasts each tensor, `POST /finish_weight_update`, `POST /reset_prefix_cache`.

The communicator behind that protocol is a small interface (`WeightCommunicator`): on GPU,
vLLM's NCCL weight-transfer group (imported inside the function, as TRL does); on CPU, a
torch.distributed gloo group of its own (a `TCPStore` the trainer hosts, a `ProcessGroupGloo`
that never touches the default process group, so it lives beside DeepSpeed's) that broadcasts
each tensor from rank 0 the same way. `qpa rollout serve --backend hf`
(`qpa.train.rl.rollout_server`) is the server side of the gloo group.

Only the trainer's main process opens the communicator and pushes weights; every rank
generates through the same server.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import math
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from qpa.train.rl.generation import Sampled

#: The prefix of the gloo group's keys in its store (one store could serve several groups).
STORE_PREFIX = "qpa-weight-sync"


class RolloutServerError(RuntimeError):
    """The rollout server is unreachable, refused a request, or answered something unexpected."""


@dataclass(frozen=True)
class ParamMeta:
    """A tensor announced before it is broadcast: name, dtype (vLLM spelling), shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, tensor: Any, *, shape: Sequence[int] | None = None) -> ParamMeta:
        """`tensor`'s announcement (`shape`: its full shape where it is a ZeRO-3 partition)."""
        dims = tuple(int(d) for d in (tensor.shape if shape is None else shape))
        return cls(name, str(tensor.dtype).removeprefix("torch."), dims)


def update_info(metas: Sequence[ParamMeta]) -> dict[str, Any]:
    """`/update_weights`' body's `update_info` for these tensors."""
    return {
        "names": [m.name for m in metas],
        "dtype_names": [m.dtype for m in metas],
        "shapes": [list(m.shape) for m in metas],
    }


def parse_update_info(info: Mapping[str, Any]) -> list[ParamMeta]:
    """The tensors an `update_info` announces (the server side of `update_info`)."""
    try:
        names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
    except KeyError as exc:
        raise ValueError(f"update_info: missing {exc.args[0]!r}") from None
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError("update_info: names, dtype_names and shapes differ in length")
    return [
        ParamMeta(str(n), str(d), tuple(int(x) for x in s))
        for n, d, s in zip(names, dtypes, shapes, strict=True)
    ]


def local_address(peer_host: str, peer_port: int = 80) -> str:
    """This machine's address on the route to `peer_host` (what the peer can connect back to):
    the UDP-connect trick, which sends nothing."""
    family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_host, peer_port))
        except OSError:
            return "127.0.0.1"
        return str(probe.getsockname()[0])


# --------------------------------------------------------------------------- communicators


class WeightCommunicator(Protocol):
    """The trainer's side of the weight-transfer group (rank 0, the source of every tensor)."""

    def send(self, tensors: Iterable[tuple[str, Any]]) -> None:
        """Broadcast the tensors, in the order they were announced."""

    def close(self) -> None:
        """Leave the group."""


class GlooCommunicator:
    """A standalone gloo group (its own `TCPStore` and `ProcessGroupGloo`, never the default
    process group): rank 0 broadcasts each tensor whole, every other rank receives it.

    `open(...)` with rank 0 hosts the store on `address:port` (a listening socket bound to that
    address only); other ranks connect to it.
    """

    def __init__(self, group: Any, store: Any, rank: int, world_size: int) -> None:
        self._group = group
        self._store = store
        self.rank = rank
        self.world_size = world_size

    @classmethod
    def open(
        cls,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        timeout_s: float = 120.0,
    ) -> GlooCommunicator:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if rank == 0:
            listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(world_size * 4)
            try:
                store = dist.TCPStore(
                    address,
                    port,
                    world_size,
                    is_master=True,
                    timeout=timeout,
                    wait_for_workers=False,
                    master_listen_fd=listener.fileno(),
                    use_libuv=False,
                )
            finally:
                listener.detach()  # the store owns the descriptor now
        else:
            store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
        device = dist.ProcessGroupGloo.create_device(hostname=local_address(address, port))
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._devices = [device]
        options._timeout = timeout
        group = dist.ProcessGroupGloo(
            dist.PrefixStore(STORE_PREFIX, store), rank, world_size, options
        )
        return cls(group, store, rank, world_size)

    def broadcast(self, tensor: Any) -> Any:
        """Broadcast `tensor` from rank 0 (in place on the other ranks); returns it."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()
        return tensor

    def send(self, tensors: Iterable[tuple[str, Any]]) -> None:
        for _, tensor in tensors:
            self.broadcast(tensor.detach().to("cpu").contiguous())

    def receive(self, metas: Sequence[ParamMeta]) -> Iterator[tuple[str, Any]]:
        """The tensors rank 0 broadcasts, one per announced `ParamMeta` (non-zero ranks)."""
        import torch

        for meta in metas:
            dtype = getattr(torch, meta.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"update_info.dtype_names: unknown dtype {meta.dtype!r}")
            yield meta.name, self.broadcast(torch.empty(meta.shape, dtype=dtype))

    def close(self) -> None:
        self._group = None
        self._store = None


class NcclCommunicator:  # pragma: no cover - needs a GPU and vLLM
    """vLLM's NCCL weight-transfer group on the trainer's side, as TRL's `VLLMClient` opens it
    (vLLM >= 0.28: `trainer_init` and the packed broadcast; before: `NCCLWeightTransferEngine`)."""

    def __init__(self, init_info: Mapping[str, Any]) -> None:
        self._stateful = _vllm_at_least("0.28.0")
        #: What every `/update_weights` adds to its `update_info` (vLLM < 0.28: `packed`).
        self.update_extra: dict[str, Any] = {} if self._stateful else {"packed": True}
        if self._stateful:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._group = trainer_init(dict(init_info))
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

            self._group = NCCLWeightTransferEngine.trainer_init(dict(init_info))

    def send(self, tensors: Iterable[tuple[str, Any]]) -> None:
        if self._stateful:
            from vllm.distributed.weight_transfer.packed_tensor import (
                packed_nccl_broadcast_producer,
            )

            packed_nccl_broadcast_producer(
                iterator=iter(tensors), group=self._group, src=0, post_iter_func=lambda x: x[1]
            )
        else:
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerSendWeightsArgs,
                NCCLWeightTransferEngine,
            )

            NCCLWeightTransferEngine.trainer_send_weights(
                iterator=iter(tensors),
                trainer_args=NCCLTrainerSendWeightsArgs(group=self._group, packed=True),
            )

    def close(self) -> None:
        group = getattr(self._group, "group", None)
        if group is not None:  # the group holds a socket the server would keep waiting on
            group.store = None
            group.socket = None
        self._group = None


def _vllm_at_least(version: str) -> bool:  # pragma: no cover - needs vLLM
    from packaging.version import Version

    return Version(importlib.metadata.version("vllm")) >= Version(version)


# --------------------------------------------------------------------------- the client


class RolloutClient:
    """A rollout server (`trl vllm-serve`, vLLM in dev mode, or `qpa rollout serve --backend
    hf`) as the trainer sees it. `wait_ready()` first; `open_communicator()` on the main
    process only."""

    def __init__(
        self,
        base_url: str,
        *,
        group_port: int = 51216,
        timeout_s: float = 240.0,
        request_timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if not parts.hostname:
            raise ValueError(f"generation.vllm_url: {base_url!r} has no host")
        self.base_url = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.group_port = group_port
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.base_url, timeout=request_timeout_s, transport=transport
        )
        self.model: str | None = None
        self.communicator: WeightCommunicator | None = None
        self.world_size = 1

    # ------------------------------------------------------------------ http
    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RolloutServerError(f"{method} {self.base_url}{path}: {exc}") from exc
        if response.status_code != 200:
            raise RolloutServerError(
                f"{method} {self.base_url}{path}: HTTP {response.status_code}: "
                f"{response.text[:500]}"
            )
        return response.json() if response.content else {}

    def wait_ready(self) -> None:
        """Poll `/health` until it answers 200 (at most `timeout_s`), then read the model."""

        def probe() -> None:
            response = self._http.get("/health", timeout=5.0)
            if response.status_code != 200:
                raise httpx.TransportError(f"/health answered {response.status_code}")

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(httpx.HTTPError),
                stop=stop_after_delay(self.timeout_s),
                wait=wait_fixed(min(1.0, self.timeout_s / 10)),
                reraise=False,
            ):
                with attempt:
                    probe()
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            raise RolloutServerError(
                f"rollout server {self.base_url} not ready after {self.timeout_s:g} s: {cause}"
            ) from cause
        models = self._request("GET", "/v1/models").get("data") or []
        if not models:
            raise RolloutServerError(f"{self.base_url}/v1/models lists no model")
        self.model = str(models[0]["id"])

    def server_info(self) -> dict[str, Any]:
        """The server's configuration (`vllm_config`); vLLM serves it in dev mode only."""
        try:
            body = self._request("GET", "/server_info", params={"config_format": "json"})
        except RolloutServerError as exc:
            if "HTTP 404" in str(exc):
                raise RolloutServerError(
                    f"rollout server {self.base_url} has no development endpoints (weight "
                    "sync needs them): start vLLM with VLLM_SERVER_DEV_MODE=1, as `trl "
                    "vllm-serve` and `qpa rollout serve --backend vllm` do"
                ) from exc
            raise
        return dict(body.get("vllm_config") or {})

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> list[Sampled]:
        """One completion per token-id prompt, with the sampler's per-token log-probs."""
        if not prompts:
            return []
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": [list(p) for p in prompts],
            "n": 1,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if stop:
            payload["stop"] = list(stop)
            payload["include_stop_str_in_output"] = True
        if seed is not None:
            payload["seed"] = seed
        choices = self._request("POST", "/v1/completions", json=payload).get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise RolloutServerError(
                f"/v1/completions: {len(choices or [])} choices for {len(prompts)} prompts"
            )
        choices = sorted(choices, key=lambda c: int(c.get("index", 0)))
        return [_sampled(choice) for choice in choices]

    # ------------------------------------------------------------------ weight sync
    def open_communicator(self, device: Any = "cpu") -> None:
        """Join the server's weight-transfer group as rank 0 (the trainer's main process)."""
        config = self.server_info().get("weight_transfer_config") or {}
        backend = config.get("backend") if isinstance(config, dict) else None
        if backend is None:
            raise RolloutServerError(
                f"rollout server {self.base_url} has no weight-transfer engine: start it with "
                "`qpa rollout serve` (or vLLM with --weight-transfer-config)"
            )
        self.world_size = int(self._request("GET", "/get_world_size")["world_size"])
        init: dict[str, Any] = {
            "master_address": local_address(self.host, self.port),
            "master_port": self.group_port,
            "rank_offset": 1,
            "world_size": self.world_size + 1,
        }
        opener: Callable[[], WeightCommunicator]
        if backend == "gloo":
            opener = lambda: GlooCommunicator.open(  # noqa: E731
                init["master_address"], self.group_port, 0, self.world_size + 1,
                timeout_s=self.timeout_s,
            )  # fmt: skip
        elif backend == "nccl":  # pragma: no cover - needs a GPU and vLLM
            if _vllm_at_least("0.28.0"):  # as TRL: packed moved from each update to the init
                init["packed"] = True
            opener = _nccl_opener(init, device)
        else:
            raise RolloutServerError(f"rollout server: unknown weight-transfer backend {backend!r}")
        # The server blocks in the rendezvous while it answers, so both run at once.
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(
                self._request, "POST", "/init_weight_transfer_engine", json={"init_info": init}
            )
            try:
                self.communicator = opener()
            except BaseException:
                answer.cancel()
                raise
            answer.result()

    def push_weights(
        self, named: Iterable[tuple[str, Any]], *, metas: Sequence[ParamMeta] | None = None
    ) -> int:
        """Send the named tensors to the server (one weight update); returns how many.

        With `metas` (what will come, announced first) `named` is streamed: each tensor is
        broadcast before the next is drawn (a ZeRO-3 gather yields one at a time)."""
        if self.communicator is None:
            raise RolloutServerError("push_weights before open_communicator")
        tensors: Iterable[tuple[str, Any]]
        if metas is None:
            listed = [(name, tensor.detach()) for name, tensor in named]
            metas = [ParamMeta.of(name, tensor) for name, tensor in listed]
            tensors = listed
        else:
            tensors = _checked(named, metas)
        self._request("POST", "/start_weight_update", json={})
        with ThreadPoolExecutor(max_workers=1) as pool:
            info = {**update_info(metas), **getattr(self.communicator, "update_extra", {})}
            answer = pool.submit(
                self._request, "POST", "/update_weights", json={"update_info": info}
            )
            self.communicator.send(tensors)
            answer.result()
        self._request("POST", "/finish_weight_update", json={})
        self._request("POST", "/reset_prefix_cache")
        return len(metas)

    def close(self) -> None:
        if self.communicator is not None:
            with contextlib.suppress(Exception):
                self.communicator.close()
            self.communicator = None
        self._http.close()


def _nccl_opener(
    init: dict[str, Any], device: Any
) -> Callable[[], WeightCommunicator]:  # pragma: no cover - needs a GPU and vLLM
    def open_nccl() -> WeightCommunicator:
        import torch

        target = torch.device(device)
        if target.type != "cuda":
            raise RolloutServerError(
                f"the server's NCCL weight transfer needs the trainer on CUDA, not {target}"
            )
        if target.index is not None:
            torch.cuda.set_device(target)
        return NcclCommunicator(init)

    return open_nccl


def _checked(
    named: Iterable[tuple[str, Any]], metas: Sequence[ParamMeta]
) -> Iterator[tuple[str, Any]]:
    """`named` as announced: a tensor that differs from its announcement stops the update
    (the receiver would misread every later byte)."""
    count = 0
    for (name, tensor), meta in zip(named, metas, strict=False):
        if ParamMeta.of(name, tensor) != meta:
            raise RolloutServerError(f"weight sync: {name} is not what was announced ({meta})")
        count += 1
        yield name, tensor
    if count != len(metas):
        raise RolloutServerError(f"weight sync: {count} tensors for {len(metas)} announced")


def _sampled(choice: Mapping[str, Any]) -> Sampled:
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise RolloutServerError("/v1/completions: a choice without token_ids")
    logprobs = choice.get("logprobs")
    values: list[float] | None = None
    if isinstance(logprobs, Mapping) and logprobs.get("token_logprobs") is not None:
        # unknown stays NaN: the loss then weights that token 1 (0.0 would mean probability 1)
        values = [float(v) if v is not None else math.nan for v in logprobs["token_logprobs"]]
        if len(values) != len(ids):
            raise RolloutServerError(
                f"/v1/completions: {len(values)} log-probs for {len(ids)} tokens"
            )
    return Sampled([int(i) for i in ids], values)
