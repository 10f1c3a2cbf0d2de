"""`qpa bench`: real runs on a filtered subset of the test split (in-process sandboxes and an
environment server over HTTP), resume after a simulated crash, reports, compare, and the gate
with passing, failing, partial, corrupt and missing reports.

The CLI is driven through its Typer sub-app (`qpa.cli.bench.bench_app`) with `CliRunner`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.uvicorn_thread import serve
from typer.testing import CliRunner

from qpa.bench.gate import load_report
from qpa.bench.report import compare, write_report
from qpa.bench.run import finish, run_bench, select_tasks
from qpa.bench.scoring import score
from qpa.cli.bench import bench_app
from qpa.contract import read_trajectories
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app
from qpa.harness.factory import PlannerSpec

runner = CliRunner()
LIMIT = 8
TASKS = select_tasks(generate_suite(), split="test", limit=LIMIT)


def invoke(*args: str) -> Any:
    return runner.invoke(bench_app, list(args))


def keys_in(path: Path) -> list[tuple[str, int]]:
    return [(t.task.id, t.sample) for t in read_trajectories(path)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench")
    oracle, noisy = root / "oracle", root / "noisy"
    result = invoke(
        "run",
        "--planner",
        "oracle",
        "--limit",
        str(LIMIT),
        "-k",
        "2",
        "-j",
        "3",
        "--out",
        str(oracle),
    )
    assert result.exit_code == 0, result.output
    result = invoke(
        "run",
        "--planner",
        "noisy",
        "--noise",
        "0.6",
        "--limit",
        str(LIMIT),
        "-k",
        "3",
        "-j",
        "2",
        "--out",
        str(noisy),
        "--no-plots",
    )
    assert result.exit_code == 0, result.output
    return {"oracle": oracle, "noisy": noisy}


# --------------------------------------------------------------------------- runs


def test_oracle_run_writes_trajectories_and_a_full_report(runs: dict[str, Path]) -> None:
    out = runs["oracle"]
    for name in ("trajectories.jsonl", "report.json", "report.md", "run.json"):
        assert (out / name).is_file(), name
    for name in ("capabilities.png", "success_vs_tokens.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keys = keys_in(out / "trajectories.jsonl")
    assert len(keys) == len(set(keys)) == 2 * LIMIT
    assert {k[0] for k in keys} == {t.id for t in TASKS}
    report = load_report(out)
    assert (report.tasks, report.samples, report.episodes) == (LIMIT, 2, 2 * LIMIT)
    assert report.complete and report.overall == 1.0 and report.mean_progress == 1.0
    assert report.pass_at_k == {1: 1.0, 2: 1.0} and report.pass_hat_k == {1: 1.0, 2: 1.0}
    assert set(report.by_capability) == {c for t in TASKS for c in t.capabilities}
    assert set(report.ci) == {"overall", *report.by_capability}
    assert sum(g.tasks for g in report.by_domain.values()) == LIMIT
    assert len(report.by_domain) == len({t.domain for t in TASKS}) > 1  # spread over domains
    assert report.turns > 1 and report.tool_calls >= 1 and report.errors == 0
    assert report.output_tokens_per_task == 0 and report.cost_per_1k_tasks == 0
    assert report.policy.planner == "oracle"
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "Overall success: 100.0%" in markdown and "capabilities.png" in markdown
    assert "By capability" in markdown and "By domain" in markdown


def test_noisy_run_scores_below_the_oracle_with_pass_at_k(runs: dict[str, Path]) -> None:
    report = load_report(runs["noisy"])
    assert report.complete and report.episodes == 3 * LIMIT
    assert 0.0 < report.overall < 1.0
    assert report.pass_at_k[3] >= report.pass_at_k[1] >= report.pass_hat_k[3]
    assert report.pass_at_k[1] == pytest.approx(report.overall)
    assert not (runs["noisy"] / "capabilities.png").exists()  # --no-plots


def test_filters_and_bad_requests(tmp_path: Path) -> None:
    out = tmp_path / "memory"
    result = invoke(
        "run", "--capability", "memory", "--limit", "3", "--no-plots", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    trajectories = list(read_trajectories(out / "trajectories.jsonl"))
    assert len(trajectories) == 3 and all("memory" in t.task.capabilities for t in trajectories)
    domain = TASKS[0].domain
    result = invoke(
        "run", "--domain", domain, "--limit", "2", "--no-plots", "--out", str(out / "d")
    )
    assert result.exit_code == 0, result.output
    assert {t.task.domain for t in read_trajectories(out / "d" / "trajectories.jsonl")} == {domain}
    for args, message in [
        (["--capability", "telepathy"], "telepathy"),
        (["--split", "holdout"], "holdout"),
        (["--suite", "nosuch"], "nosuch"),
        (["--planner", "psychic"], "psychic"),
        (["--domain", "nowhere"], "no tasks selected"),
    ]:
        result = invoke("run", *args, "--out", str(tmp_path / "bad"))
        assert result.exit_code == 2 and message in result.output, result.output


# --------------------------------------------------------------------------- resume


def test_resume_after_a_crash_runs_exactly_the_missing_episodes(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    lines = (runs["noisy"] / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    total, keep = len(lines), 10
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    cut = lines[keep][: len(lines[keep]) // 2]  # the line being written when the process died
    (crashed / "trajectories.jsonl").write_bytes(b"".join(lines[:keep]) + cut)
    done = {(json.loads(raw)["task"]["id"], json.loads(raw)["sample"]) for raw in lines[:keep]}
    everything = {(t.id, s) for t in TASKS for s in range(3)}

    ran: list[tuple[str, int]] = []
    run = run_bench(
        TASKS,
        PlannerSpec("noisy", noise=0.6),
        crashed,
        samples=3,
        concurrency=2,
        on_episode=lambda record: ran.append(record.key),
    )
    assert run.resume.dropped_tail and run.resume.rewritten
    assert (run.ran, run.skipped) == (total - keep, keep)
    assert len(ran) == len(set(ran)) and set(ran) == everything - done
    keys = keys_in(crashed / "trajectories.jsonl")
    assert len(keys) == len(set(keys)) == total and set(keys) == everything
    # the resumed run scores exactly like the uninterrupted one
    report = finish(run, plots=False)
    original = load_report(runs["noisy"])
    assert report.model_dump(exclude={"created_at"}) == original.model_dump(exclude={"created_at"})
    # and a rerun of a finished folder runs nothing
    again = invoke(
        "run",
        "--planner",
        "noisy",
        "--noise",
        "0.6",
        "--limit",
        str(LIMIT),
        "-k",
        "3",
        "--out",
        str(crashed),
        "--no-plots",
    )
    assert again.exit_code == 0 and f"resuming: {total} of {total}" in again.output
    assert "0 episodes run" in again.output
    assert len(keys_in(crashed / "trajectories.jsonl")) == total


def test_a_stopped_run_loses_at_most_the_episodes_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qpa.harness.pool as pool

    slow_episode = pool.run_episode
    started: list[int] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        time.sleep(0.02)
        return slow_episode(*args, **kwargs)

    monkeypatch.setattr(pool, "run_episode", slow)
    stop, seen = threading.Event(), []

    def on_episode(record: Any) -> None:
        seen.append(record.key)
        if len(seen) == 4:
            stop.set()  # the "kill": no new episode starts, the ones in flight finish

    first = run_bench(
        TASKS,
        PlannerSpec("oracle"),
        tmp_path,
        samples=2,
        concurrency=3,
        stop=stop,
        on_episode=on_episode,
    )
    assert first.interrupted and 4 <= first.ran < 2 * LIMIT
    assert first.ran == len(started)  # every episode that started was written
    assert len(keys_in(tmp_path / "trajectories.jsonl")) == first.ran
    partial = score(first.records, samples=2, expected_tasks=first.task_ids)
    assert not partial.complete and partial.missing_episodes == 2 * LIMIT - first.ran
    second = run_bench(TASKS, PlannerSpec("oracle"), tmp_path, samples=2, concurrency=3)
    assert not second.interrupted and second.ran == 2 * LIMIT - first.ran
    keys = keys_in(tmp_path / "trajectories.jsonl")
    assert len(keys) == len(set(keys)) == 2 * LIMIT


def test_a_corrupt_file_or_another_policy_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    lines = (runs["oracle"] / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "trajectories.jsonl").write_bytes(lines[0] + b'{"id": "half\n' + lines[1])
    result = invoke("run", "--limit", str(LIMIT), "--out", str(tmp_path))
    assert result.exit_code == 2 and ":2: corrupt line" in result.output
    result = invoke("run", "--planner", "noop", "--limit", str(LIMIT), "--out", str(runs["oracle"]))
    assert result.exit_code == 2 and "another policy" in result.output


# --------------------------------------------------------------------------- env servers


@contextlib.contextmanager
def serving() -> Iterator[str]:
    with serve(create_app("sandbox")) as url:
        yield url


def test_run_against_an_environment_server(tmp_path: Path) -> None:
    with serving() as url:
        result = invoke(
            "run",
            "--env-url",
            url,
            "--limit",
            "4",
            "-j",
            "2",
            "--no-plots",
            "--out",
            str(tmp_path / "remote"),
        )
        assert result.exit_code == 0, result.output
    report = load_report(tmp_path / "remote")
    assert report.overall == 1.0 and report.episodes == 4 and report.errors == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = invoke("run", "--env-url", dead, "--limit", "2", "--out", str(tmp_path / "dead"))
    assert result.exit_code == 2 and "not answering" in result.output


# --------------------------------------------------------------------------- reports


def test_report_command_rerenders_and_rescores(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(runs["oracle"], out)  # the shared run stays as it is
    (out / "report.md").unlink()
    result = invoke("report", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "report.md").is_file() and "overall" in result.output
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\n", encoding="utf-8")
    result = invoke("report", str(out), "--rescore", "--prices", str(prices))
    assert result.exit_code == 0, result.output
    assert load_report(out).currency == "EUR"
    result = invoke("report", str(tmp_path / "empty"))
    assert result.exit_code == 2 and "missing" in result.output


def test_compare_prints_deltas_and_significance(runs: dict[str, Path]) -> None:
    result = invoke("compare", str(runs["oracle"]), str(runs["noisy"]))
    assert result.exit_code == 0, result.output
    for text in ("overall", "tool_use", "delta", "paired bootstrap", "worse"):
        assert text in result.output, text
    as_json = invoke("compare", str(runs["oracle"]), str(runs["noisy"]), "--json")
    table = json.loads(as_json.output)
    overall = next(r for r in table["rows"] if r["metric"] == "overall")
    assert overall["delta"] < 0 and overall["significant"] is True
    assert overall["method"] == "paired_bootstrap" and overall["tasks"] == LIMIT
    assert overall["ci_low"] <= overall["delta"] <= overall["ci_high"]
    same = compare(load_report(runs["oracle"]), load_report(runs["oracle"]))
    assert same.row("overall").delta == 0 and same.row("overall").significant is False
    by_domain = compare(load_report(runs["oracle"]), load_report(runs["noisy"]), by_domain=True)
    assert any(r.metric.startswith("domain:") for r in by_domain.rows)


# --------------------------------------------------------------------------- gate


def gate(*args: str) -> tuple[int, dict[str, Any]]:
    result = invoke("gate", *args, "--json")
    return result.exit_code, json.loads(result.output) if result.output.startswith("{") else {}


def test_gate_exit_codes(runs: dict[str, Path], tmp_path: Path) -> None:
    oracle, noisy = str(runs["oracle"]), str(runs["noisy"])
    assert gate("--candidate", oracle, "--baseline", noisy)[0] == 0
    assert gate("--candidate", oracle)[0] == 0  # first release
    code, result = gate("--candidate", noisy, "--baseline", oracle)
    assert code == 1 and not result["passed"]
    assert any("capability_regression" in c["name"] and not c["passed"] for c in result["checks"])
    assert len(result["reasons"]) >= 2
    table = invoke("gate", "--candidate", noisy, "--baseline", oracle)
    assert table.exit_code == 1 and "FAIL" in table.output

    code, result = gate("--candidate", str(tmp_path / "none.json"), "--baseline", oracle)
    assert code == 1 and "missing" in result["reasons"][0]
    code, result = gate("--candidate", oracle, "--baseline", str(tmp_path / "none.json"))
    assert code == 1 and "missing" in result["reasons"][0]
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text((runs["oracle"] / "report.json").read_text()[:300], encoding="utf-8")
    code, result = gate("--candidate", str(corrupt), "--baseline", oracle)
    assert code == 1 and "corrupt JSON" in result["reasons"][0]

    # a real partial report: one episode never ran
    records = list(read_trajectories(runs["oracle"] / "trajectories.jsonl"))[:-1]
    partial = score(records, samples=2, expected_tasks=[t.id for t in TASKS])
    write_report(partial, tmp_path / "partial", plots=False)
    code, result = gate("--candidate", str(tmp_path / "partial"), "--baseline", oracle)
    assert code == 1 and any("partial: 1 episodes missing" in r for r in result["reasons"])

    spec = tmp_path / "gate.yaml"
    spec.write_text("min_overall: 0.2\nmax_capability_regression: 1.0\n", encoding="utf-8")
    assert gate("--candidate", noisy, "--baseline", oracle, "--spec", str(spec))[0] == 0
    spec.write_text("min_overall: 0.2\nmax_regression: 1.0\n", encoding="utf-8")
    bad = invoke("gate", "--candidate", noisy, "--spec", str(spec))
    assert bad.exit_code == 2 and "max_regression" in bad.output


MALFORMED: list[tuple[str, Any, str]] = [
    # (field to change, new value or "<drop>", text the failure must name)
    ("overall", "<drop>", "overall"),
    ("overall", 1.2, "overall"),
    ("schema_version", 7, "schema_version"),
    ("policy", "oracle", "policy"),
    ("samples", -1, "samples"),
    ("tasks", 3, "tasks"),
    ("complete", "maybe", "complete"),
    (
        "by_capability",
        {"luck": {"success": 1, "mean_progress": 1, "tasks": 1, "episodes": 1}},
        "by_capability.luck",
    ),
    ("per_task", "<first-task-successes=9>", "successes"),
    ("ci", {"overall": {"low": 0.8, "high": 0.2}}, "ci.overall"),
    ("pass_at_k", {"9": 1.0}, "pass_at_k"),
    ("errors", 10_000, "errors"),
    ("cost_per_1k_tasks", -1, "cost_per_1k_tasks"),
    ("unexpected", 1, "unexpected"),
]


@pytest.mark.parametrize(("field", "value", "named"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_reports_fail_the_gate_naming_the_field(
    runs: dict[str, Path], tmp_path: Path, field: str, value: Any, named: str
) -> None:
    data = json.loads((runs["oracle"] / "report.json").read_text(encoding="utf-8"))
    if value == "<drop>":
        del data[field]
    elif value == "<first-task-successes=9>":
        next(iter(data["per_task"].values()))["successes"] = 9
    else:
        data[field] = value
    broken = tmp_path / "report.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    for args in (
        ("--candidate", str(broken), "--baseline", str(runs["oracle"])),
        ("--candidate", str(runs["oracle"]), "--baseline", str(broken)),
    ):
        code, result = gate(*args)
        assert code == 1 and not result["passed"]
        assert any(named in reason and str(broken) in reason for reason in result["reasons"]), (
            result["reasons"]
        )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("min_overall: 2\n", "min_overall"),
        ("max_cost_increase: -0.5\n", "max_cost_increase"),
        ("min_tasks: 0\n", "min_tasks"),
        ("require_complete: sometimes\n", "require_complete"),
        ("thresholds: {}\n", "thresholds"),
    ],
)
def test_malformed_gate_specs_exit_2_naming_the_field(
    runs: dict[str, Path], tmp_path: Path, text: str, named: str
) -> None:
    spec = tmp_path / "gate.yaml"
    spec.write_text(text, encoding="utf-8")
    result = invoke("gate", "--candidate", str(runs["oracle"]), "--spec", str(spec))
    assert result.exit_code == 2 and named in result.output, result.output


def test_retry_errors_reruns_only_episodes_a_dead_server_ended(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    lines = (runs["oracle"] / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    broken: set[tuple[str, int]] = set()
    for index in (1, 4):  # two episodes "ended by a dead environment server"
        data = json.loads(lines[index])
        data["error"] = "environment: RemoteEnvError: connection refused"
        data["verification"] = {"done": False, "success": False, "progress": 0.0}
        lines[index] = json.dumps(data)
        broken.add((data["task"]["id"], data["sample"]))
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ("run", "--limit", str(LIMIT), "-k", "2", "--no-plots", "--out", str(tmp_path))
    result = invoke(*args)
    assert result.exit_code == 0 and "0 episodes run" in result.output
    assert "--retry-errors" in result.output  # the report warns about them
    assert load_report(tmp_path).errors_by_side == {"environment": 2}
    ran: list[tuple[str, int]] = []
    run = run_bench(
        TASKS,
        PlannerSpec("oracle"),
        tmp_path,
        samples=2,
        retry_errors=True,
        on_episode=lambda record: ran.append(record.key),
    )
    assert set(ran) == broken and run.resume.dropped_errors == 2
    keys = keys_in(tmp_path / "trajectories.jsonl")
    assert len(keys) == len(set(keys)) == 2 * LIMIT
    assert finish(run, plots=False).overall == 1.0


def test_a_model_planner_with_a_price_table(tmp_path: Path) -> None:
    from fakes.openai_server import FakeOpenAI, Reply

    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "currency: USD\nmodels:\n  fake-*: {prompt_per_1m: 1.0, completion_per_1m: 10.0}\n",
        encoding="utf-8",
    )
    with FakeOpenAI(lambda request: Reply(content="<finish>done</finish>")) as server:
        result = invoke(
            "run",
            "--planner",
            "openai",
            "--model-url",
            server.base_url,
            "--model",
            "fake-m",
            "--limit",
            "4",
            "-j",
            "2",
            "--prices",
            str(prices),
            "--no-plots",
            "--out",
            str(tmp_path / "model"),
        )
        assert result.exit_code == 0, result.output
        assert server.handler_errors == []
    report = load_report(tmp_path / "model")
    assert report.policy.model == "fake-m" and report.episodes == 4
    assert report.output_tokens_per_task > 0 and report.prompt_tokens_per_task > 0
    expected = (
        (report.prompt_tokens_per_task * 1.0 + report.output_tokens_per_task * 10.0) / 1e6 * 1000
    )
    assert report.cost_per_1k_tasks == pytest.approx(expected)
    assert report.output_tokens_per_success is None  # finishing at once never succeeds


def test_two_runs_never_write_one_folder(tmp_path: Path) -> None:
    import fcntl

    with open(tmp_path / "run.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # "another run" holds it
        held.write("pid 4242\n")
        held.flush()
        result = invoke("run", "--limit", "2", "--out", str(tmp_path))
        assert result.exit_code == 2 and "pid 4242" in result.output
        assert not (tmp_path / "trajectories.jsonl").exists()
    result = invoke("run", "--limit", "2", "--no-plots", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
