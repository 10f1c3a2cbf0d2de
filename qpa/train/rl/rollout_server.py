"""The rollout server a TrainingRun starts (`qpa rollout serve`): vLLM on GPU, HF on CPU.

- `--backend vllm` execs TRL's `trl vllm-serve` command line (`trl.scripts.vllm_serve.
  build_command`: vLLM's OpenAI server with the NCCL weight-transfer engine and processed
  log-probs, `VLLM_SERVER_DEV_MODE=1`) for the model, tensor-parallel size, dtype and
  maximum model length. Nothing here imports vLLM.
- `--backend hf` serves the SAME HTTP API (the subset TRL's `VLLMClient` and
  `qpa.train.rl.vllm.RolloutClient` use; see that module) with a Hugging Face transformers model:
  `/v1/completions` samples with `generate` and returns each sampled token's log-probability
  under the processed (temperature, top-k/top-p) distribution, as vLLM's `processed_logprobs`
  mode does; the weight-transfer endpoints receive the trainer's tensors over a gloo group
  (`GlooCommunicator`, this server being rank 1) and copy them into the model. It is the
  stand-in the CPU tests use, and a real option for a CPU cluster.

One extra route, `GET /qpa/weights/digest`, answers a SHA-256 over the served weights
(`weights_digest`), so a caller can check the server holds exactly the trainer's weights.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import Body, FastAPI, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from qpa.api.v1alpha1 import TrainingRun, WorkOrder
from qpa.train.rl.generation import trim_completion
from qpa.train.rl.vllm import GlooCommunicator, parse_update_info

Backend = Literal["hf", "vllm"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
#: The port the operator's rollout Deployment serves on (and its Service forwards).
DEFAULT_PORT = 8000
#: The weight-transfer group's rendezvous port (`generation.vllm_group_port`, TRL's default).
DEFAULT_GROUP_PORT = 51216


class RolloutServeConfig(BaseModel):
    """What `qpa rollout serve` runs: flags for humans, `from_trainingrun` for the operator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = "hf"
    model: str = Field(min_length=1, description="model folder, store URI or (vllm) hub id")
    tokenizer: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    dtype: Dtype = "auto"
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    group_timeout_s: float = Field(default=300.0, gt=0)
    log_level: str = "warning"

    @classmethod
    def from_trainingrun(
        cls, order: WorkOrder[TrainingRun], *, host: str = "0.0.0.0"
    ) -> RolloutServeConfig:
        """The server a TrainingRun's `spec.rl.generation` asks for: its base model, on the
        port of the URL the operator gave the ranks (`resolved.rolloutServerUrl`)."""
        spec = order.resource.spec
        generation = spec.rl.generation if spec.rl is not None else None
        if generation is None:
            raise ValueError("spec.rl.generation: the TrainingRun asks for no rollout server")
        url = order.resolved.rollout_server_url
        return cls(
            backend=generation.backend,
            model=spec.base_model_uri,
            served_model_name=order.name,
            host=host,
            port=(urlsplit(url).port if url else None) or DEFAULT_PORT,
            dtype=generation.dtype,
            tensor_parallel_size=generation.tensor_parallel,
            max_model_len=generation.max_model_length,
        )


def vllm_command(config: RolloutServeConfig, model_path: str) -> list[str]:
    """TRL's `trl vllm-serve` command line for `config` (vLLM's server, TRL's settings)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    args = ScriptArguments(
        model=model_path,
        host=config.host,
        port=config.port,
        tensor_parallel_size=config.tensor_parallel_size,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        gpu_memory_utilization=config.gpu_memory_utilization,
        log_level=config.log_level,
    )
    extra = ["--served-model-name", config.served_model_name] if config.served_model_name else []
    return build_command(args, extra)


def exec_vllm(config: RolloutServeConfig, model_path: str) -> None:  # pragma: no cover - execs
    """Replace this process by vLLM's server (what `trl vllm-serve` does)."""
    command = vllm_command(config, model_path)
    os.execve(sys.executable, command, {**os.environ, "VLLM_SERVER_DEV_MODE": "1"})


def weights_digest(model: Any) -> str:
    """SHA-256 over the model's named parameters (name, dtype, shape, bytes), in name order."""
    import torch

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        tensor = param.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class CompletionRequest(BaseModel):
    """The `/v1/completions` fields the server honours (others are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[list[int]] | list[str] | str | list[int]
    n: int = Field(default=1, ge=1, le=64)
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    logprobs: int | None = Field(default=None, ge=0)
    stop: list[str] | str | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None


class HFEngine:
    """A transformers causal LM behind the server: batched sampling with log-probs, and weight
    updates received over the gloo group. One lock serialises generation and updates."""

    def __init__(self, config: RolloutServeConfig, model_dir: Path, tokenizer_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(config.dtype, "auto")
        if config.dtype == "float16":
            dtype = torch.float16
        self.config = config
        self.name = config.served_model_name or str(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=dtype
        )
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.max_model_len = config.max_model_len or int(
            getattr(model.config, "max_position_embeddings", 0) or 1 << 30
        )
        self.lock = threading.Lock()
        self.communicator: GlooCommunicator | None = None
        self.updates = 0

    # ------------------------------------------------------------------ generation
    def _prompts(self, request: CompletionRequest) -> list[list[int]]:
        prompt = request.prompt
        items: list[Any] = [prompt] if isinstance(prompt, str) else list(prompt)
        if items and all(isinstance(x, int) for x in items):
            items = [items]
        prompts = [
            list(self.tokenizer(x, add_special_tokens=False)["input_ids"])
            if isinstance(x, str)
            else [int(t) for t in x]
            for x in items
        ]
        if not prompts or any(not p for p in prompts):
            raise HTTPException(400, "prompt: empty")
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise HTTPException(
                400,
                f"prompt: {longest} tokens; this model's maximum context length is "
                f"{self.max_model_len}",
            )
        return prompts

    def complete(self, request: CompletionRequest) -> dict[str, Any]:
        import torch
        from transformers import GenerationConfig

        prompts = self._prompts(request)
        rows = [p for p in prompts for _ in range(request.n)]
        tokenizer = self.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        stop_strings: list[str] = []
        words = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        for word in words:
            ids = tokenizer.encode(word, add_special_tokens=False)
            if len(ids) == 1:
                stops.append(ids[0])
            else:
                stop_strings.append(word)
        budget = min(request.max_tokens, self.max_model_len - max(len(p) for p in rows))
        width = max(len(p) for p in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for row, ids in enumerate(rows):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        greedy = request.temperature == 0
        generation = GenerationConfig(
            max_new_tokens=budget,
            do_sample=not greedy,
            temperature=None if greedy else request.temperature,
            top_p=None if greedy else request.top_p,
            top_k=None if greedy else max(0, request.top_k),
            repetition_penalty=1.0,
            use_cache=True,
            pad_token_id=pad,
            eos_token_id=stops or None,
            stop_strings=stop_strings or None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        with self.lock, torch.no_grad():
            if request.seed is not None:
                torch.manual_seed(request.seed)
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=generation,
                tokenizer=tokenizer if stop_strings else None,
            )
        new = output.sequences[:, width:].tolist()
        # Processed scores (after temperature and top-k/top-p): vLLM's processed_logprobs.
        logps = torch.stack([s.float().log_softmax(-1) for s in output.scores], dim=1)
        choices = []
        for index, row in enumerate(new):
            ids = trim_completion(row, stops, pad)
            finished = bool(ids) and (ids[-1] in stops or _ends_with(tokenizer, ids, stop_strings))
            values = [float(logps[index, t, token]) for t, token in enumerate(ids)]
            choice: dict[str, Any] = {
                "index": index,
                "text": tokenizer.decode(ids, skip_special_tokens=request.skip_special_tokens),
                "token_ids": ids,
                "prompt_token_ids": rows[index],
                "finish_reason": "stop" if finished else "length",
                "logprobs": None,
            }
            if request.logprobs is not None:
                tokens = [f"token_id:{t}" for t in ids]
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": values,
                    "top_logprobs": [{tok: v} for tok, v in zip(tokens, values, strict=True)],
                    "text_offset": list(range(len(ids))),
                }
            choices.append(choice)
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        return {
            "id": f"cmpl-{time.time_ns():x}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": sum(len(p) for p in prompts),
                "completion_tokens": completion_tokens,
                "total_tokens": sum(len(p) for p in prompts) + completion_tokens,
            },
        }

    # ------------------------------------------------------------------ weights
    def init_transfer(self, init_info: Mapping[str, Any]) -> None:
        try:
            address = str(init_info["master_address"])
            port = int(init_info["master_port"])
            world = int(init_info["world_size"])
            offset = int(init_info.get("rank_offset", 1))
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPException(400, f"init_info: {exc}") from None
        if world != offset + 1:
            raise HTTPException(
                400, f"init_info.world_size: {world}, but this server has 1 worker (rank {offset})"
            )
        if self.communicator is not None:
            self.communicator.close()
        self.communicator = GlooCommunicator.open(
            address, port, offset, world, timeout_s=self.config.group_timeout_s
        )

    def update(self, info: Mapping[str, Any]) -> int:
        if self.communicator is None:
            raise HTTPException(409, "update_weights before init_weight_transfer_engine")
        try:
            metas = parse_update_info(info)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        params = dict(self.model.named_parameters())
        problems: list[str] = []
        with self.lock:
            # Every announced tensor is received (the sender is blocked in the broadcast)
            # before any problem is answered.
            for name, tensor in self.communicator.receive(metas):
                target = params.get(name)
                if target is None:
                    problems.append(f"{name}: no such parameter")
                elif tuple(target.shape) != tuple(tensor.shape):
                    problems.append(f"{name}: shape {tuple(tensor.shape)} != {tuple(target.shape)}")
                else:
                    target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if problems:
            raise HTTPException(400, "update_info.names: " + "; ".join(problems[:5]))
        self.updates += 1
        return len(metas)


def _ends_with(tokenizer: Any, ids: Sequence[int], words: Sequence[str]) -> bool:
    if not words:
        return False
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return any(text.endswith(word) for word in words)


def create_app(engine: HFEngine) -> FastAPI:
    """The HTTP API of vLLM's server (dev mode) that TRL's client uses, over `engine`."""
    app = FastAPI(title="qpa rollout server (hf)", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.name,
                    "object": "model",
                    "owned_by": "qpa",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    @app.get("/server_info")
    def server_info(config_format: str = Query(default="json")) -> dict[str, Any]:
        return {
            "vllm_config": {
                "model_config": {
                    "model": engine.name,
                    "max_model_len": engine.max_model_len,
                    "dtype": str(next(engine.model.parameters()).dtype).removeprefix("torch."),
                },
                "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1},
                "weight_transfer_config": {"backend": "gloo"},
            }
        }

    @app.get("/get_world_size")
    def world_size() -> dict[str, int]:
        return {"world_size": 1}

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict[str, Any]:
        return engine.complete(request)

    @app.post("/init_weight_transfer_engine")
    def init_transfer(body: dict[str, Any] = Body(...)) -> dict[str, bool]:
        info = body.get("init_info")
        if not isinstance(info, dict):
            raise HTTPException(400, "init_info: expected an object")
        engine.init_transfer(info)
        return {"success": True}

    @app.post("/start_weight_update")
    def start_update() -> dict[str, bool]:
        return {"success": True}

    @app.post("/update_weights")
    def update_weights(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        info = body.get("update_info")
        if not isinstance(info, dict):
            raise HTTPException(400, "update_info: expected an object")
        return {"success": True, "tensors": engine.update(info)}

    @app.post("/finish_weight_update")
    def finish_update() -> dict[str, bool]:
        return {"success": True}

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache() -> dict[str, bool]:
        return {"success": True}  # no prefix cache: `generate` recomputes every prompt

    @app.get("/qpa/weights/digest")
    def digest() -> dict[str, Any]:
        with engine.lock:
            return {"sha256": weights_digest(engine.model), "updates": engine.updates}

    return app


def serve(config: RolloutServeConfig, model_dir: Path, tokenizer_dir: Path | None = None) -> None:
    """Run the HF rollout server until interrupted."""
    import uvicorn

    engine = HFEngine(config, model_dir, tokenizer_dir or model_dir)
    uvicorn.run(create_app(engine), host=config.host, port=config.port, log_level=config.log_level)
