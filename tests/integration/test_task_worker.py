"""``manage.py leasecast_worker`` as real processes, against a real gateway and database.

Three kinds of process share one database: the gateway (``gateway.settings``),
the driver (``tests.tasksite.driver``: enqueues through ``LeasecastBackend``
and reads results with ``get_result``, as a web process would) and workers
(``tests.tasksite.settings``). A worker gets a token with ``consume`` scope
on its queues and ``publish`` on the tasks' topics only, and a
``DATABASE_URL`` that leads nowhere: it must run on the gateway alone (its
progress and outcomes go to ``task.RESULT_ID`` over its own socket). The
driver also cancels tasks (``gateway.tasks.cancel``) as a web process would.
``TASKSITE_WORKER`` makes ``tests.tasksite.unimportable`` fail to import in
workers only, and ``TASKSITE_IMPORTED`` makes
``tests.tasksite.side_effect`` write a file when a worker imports it: neither
is in the workers' registry (protocol 1.2, Tasks: only registered tasks run),
so neither may ever be imported there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import http, unique
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until_blocking

TASKS = "tests.tasksite.tasks"
FINISHED = ("SUCCESSFUL", "FAILED")


class Driver:
    """The enqueuing side: ``python -m tests.tasksite.driver``, one JSON line per request."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.tasksite.driver"],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "tests.tasksite.settings"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the driver exited"
        reply: dict[str, Any] = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def enqueue(self, task: str, queue: str, *args: Any, priority: int = 0, **kwargs: Any) -> str:
        path = task if "." in task else f"{TASKS}.{task}"
        reply = self.call(
            op="enqueue", task=path, queue=queue, priority=priority, args=args, kwargs=kwargs
        )
        return str(reply["id"])

    def result(self, result_id: str) -> dict[str, Any]:
        return self.call(op="result", id=result_id)

    def finished(self, *ids: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The results of ``ids`` once every one is SUCCESSFUL or FAILED."""

        def done() -> list[dict[str, Any]] | None:
            results = [self.result(i) for i in ids]
            return results if all(r["status"] in FINISHED for r in results) else None

        found: list[dict[str, Any]] = wait_until_blocking(
            done, f"results of {ids}", timeout=timeout
        )
        return found

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


class WorkerProcess:
    """``manage.py leasecast_worker`` with its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, args: list[str]) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "leasecast_worker", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and text not in self.log_text():
                raise AssertionError(f"the worker exited:\n{self.log_text()[-3000:]}")
            return text in self.log_text()

        wait_until_blocking(seen, f"{text!r} in the worker's log", timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Site:
    """The gateway, its tokens, the driver, and a factory of worker processes."""

    def __init__(self, gateway: GatewayProcess, admin: str, env: dict[str, str]) -> None:
        self.gateway = gateway
        self.admin = admin
        #: written by ``tests.tasksite.side_effect`` if a worker ever imports it
        self.imported = gateway.var_dir / "side-effect-imported"
        # The driver is no gateway: a cancel tells the task's topic over HTTP.
        teller = gateway.issue_token("publish:task.*", name="task-canceller")
        self.driver = Driver({**env, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": teller})
        # consume on its queues, publish on the tasks' topics (progress, outcomes)
        consume = gateway.issue_token("consume:tw*", "publish:task.*", name="task-worker")
        self.worker_env = {
            k: v for k, v in env.items() if k not in ("GATEWAY_SQLITE_PATH", "DATABASE_URL")
        }
        self.worker_env.update(
            DJANGO_SETTINGS_MODULE="tests.tasksite.settings",
            LEASECAST_URL=gateway.http,
            LEASECAST_TOKEN=consume,
            TASKSITE_WORKER="1",
            TASKSITE_IMPORTED=str(self.imported),
            # Nothing listens there: a worker that touched the database would fail.
            DATABASE_URL="postgresql://nobody@127.0.0.1:9/nowhere",
        )
        self.workers: list[WorkerProcess] = []

    def worker(
        self, *queues: str, concurrency: int = 1, grace: float = 30.0, **env: str
    ) -> WorkerProcess:
        name = f"worker-{queues[0]}-{len(self.workers)}.log"
        args = [arg for queue in queues for arg in ("--queue", queue)]
        process = WorkerProcess(
            {**self.worker_env, **env},
            self.gateway.var_dir / name,
            [*args, "--concurrency", str(concurrency), "--grace", str(grace)],
        )
        self.workers.append(process)
        return process

    def queue(self, queue: str) -> dict[str, Any]:
        status, doc = http("GET", f"{self.gateway.http}/api/queues/{queue}", self.admin)
        assert status == 200, doc
        result: dict[str, Any] = doc
        return result

    def configure(self, queue: str, **settings: Any) -> None:
        url = f"{self.gateway.http}/api/queues/{queue}"
        status, doc = http("PATCH", url, self.admin, settings)
        assert status == 200, doc

    def topic(self, result_id: str) -> list[Any]:
        """The bodies the task's topic keeps, oldest first."""
        url = f"{self.gateway.http}/api/topics/task.{result_id}/history?limit=1000"
        status, doc = http("GET", url, self.admin)
        assert status == 200, doc
        return [item["body"] for item in doc["items"]]

    def topic_ends(self, result_id: str) -> list[Any]:
        """The task topic's bodies once the last one is an outcome."""
        try:
            found: list[Any] = wait_until_blocking(
                lambda: (t := self.topic(result_id)) and t[-1]["status"] in FINISHED and t,
                f"the outcome on task.{result_id}",
            )
        except AssertionError as exc:
            logs = "\n".join(w.log_text()[-3000:] for w in self.workers)
            raise AssertionError(f"{exc}\nworkers' logs:\n{logs}") from exc
        return found

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()


@pytest.fixture(scope="module")
def site(
    database_env: tuple[dict[str, str], Path], gateway: GatewayProcess, admin_token: str
) -> Iterator[Site]:
    env, _ = database_env
    s = Site(gateway, admin_token, env)
    yield s
    s.stop_workers()
    s.driver.close()


@pytest.fixture
def tw(site: Site) -> Iterator[Site]:
    """The site, with every worker a test started killed after it."""
    yield site
    site.stop_workers()


def marks(path: Path) -> list[tuple[str, int]]:
    """The ``NAME PID`` lines the tasks wrote."""
    if not path.exists():
        return []
    return [(n, int(p)) for n, p in (line.split() for line in path.read_text().splitlines())]


def test_tasks_run_once_and_their_outcomes_are_recorded(tw: Site, tmp_path: Path) -> None:
    q, other = unique("tw"), unique("tw")
    tw.configure(q, max_deliveries=3)
    mark = str(tmp_path / "marks")
    ids = {
        "add": tw.driver.enqueue("add", q, 2, 3, mark=mark),
        "other_queue": tw.driver.enqueue("add", other, 1, 1, mark=mark),
        "async_add": tw.driver.enqueue("async_add", q, 4, 5, mark=mark),
        "with_context": tw.driver.enqueue("with_context", q, mark=mark),
        "not_json": tw.driver.enqueue("not_json", q),
        "lost": tw.driver.enqueue("tests.tasksite.unimportable.lost", q),
        "fail": tw.driver.enqueue("fail", q, mark=mark),
    }
    status, _ = http(
        "POST", f"{tw.gateway.http}/api/queues/{q}/messages", tw.admin,
        {"messages": [{"body": {"hello": "not a task"}}]},
    )  # fmt: skip
    assert status == 200
    worker = tw.worker(q, other, concurrency=4)
    results = dict(zip(ids, tw.driver.finished(*ids.values()), strict=True))

    assert (results["add"]["status"], results["add"]["return_value"]) == ("SUCCESSFUL", 5)
    assert results["add"]["attempts"] == 1
    (worker_id,) = results["add"]["worker_ids"]
    assert worker_id.endswith(f":{worker.pid}")
    assert results["other_queue"]["return_value"] == 2
    assert (results["async_add"]["status"], results["async_add"]["return_value"]) == (
        "SUCCESSFUL",
        9,
    )
    assert results["with_context"]["return_value"] == {"attempt": 1, "id": ids["with_context"]}

    not_json = results["not_json"]
    assert (not_json["status"], not_json["attempts"]) == ("FAILED", 1)
    assert not_json["errors"][-1]["exception_class_path"] == "builtins.TypeError"
    assert "not JSON" in not_json["errors"][-1]["traceback"]

    # Not in the registry: FAILED at once, its module never imported (importing
    # it would have raised "not installed on this worker").
    lost = results["lost"]
    assert (lost["status"], lost["attempts"], len(lost["errors"])) == ("FAILED", 1, 1)
    assert lost["errors"][0]["exception_class_path"] == "gateway.task_worker.UnregisteredTask"
    assert "not a registered task" in lost["errors"][0]["traceback"]
    assert "not installed on this worker" not in lost["errors"][0]["traceback"]

    fail = results["fail"]
    assert (fail["status"], fail["attempts"], len(fail["errors"])) == ("FAILED", 3, 3)
    for error in fail["errors"]:
        assert error["exception_class_path"] == "builtins.ValueError"
        assert "tasksite/tasks.py" in error["traceback"]
        assert error["traceback"].rstrip().endswith("ValueError: boom")

    # Each task ran once, the failing one once per allowed delivery.
    assert sorted(name for name, _ in marks(tmp_path / "marks")) == [
        "add", "add", "async_add", "fail", "fail", "fail", "with_context",
    ]  # fmt: skip
    # The body that is not a task was dead-lettered; nothing else is left.
    stats = wait_until_blocking(
        lambda: (s := tw.queue(q))["dead"] == 1 and s, "the dead-lettered body"
    )
    assert (stats["visible"], stats["delayed"], stats["in_flight"]) == (0, 0, 0)
    text = worker.log_text()
    assert "is not a task" in text
    assert text.count(f"{TASKS}.fail [{ids['fail']}] started") == 3
    assert worker.proc.poll() is None  # none of it stopped the worker


def test_a_message_naming_an_unregistered_task_fails_and_imports_nothing(
    tw: Site, tmp_path: Path
) -> None:
    """Only the registry runs: a message naming any other module is FAILED unimported.

    ``side_effect.touch`` is a real task, enqueued through the backend (its
    result is marked FAILED); ``this.nothing`` is a message a producer forged
    (no result to record: it is acked, so it is not retried). Importing either
    module would leave a trace: a file written, the Zen of Python printed.
    """
    q = unique("tw")
    forged = "forged-" + unique("r")
    status, _ = http(
        "POST", f"{tw.gateway.http}/api/queues/{q}/messages", tw.admin,
        {"messages": [{"body": {"task": "this.nothing", "id": forged}}]},
    )  # fmt: skip
    assert status == 200
    touch = tw.driver.enqueue("tests.tasksite.side_effect.touch", q)
    registered = tw.driver.enqueue("add", q, 20, 22, mark=str(tmp_path / "marks"))
    worker = tw.worker(q)
    touched, added = tw.driver.finished(touch, registered)

    assert (touched["status"], touched["attempts"]) == ("FAILED", 1)
    (error,) = touched["errors"]
    assert error["exception_class_path"] == "gateway.task_worker.UnregisteredTask"
    assert "'tests.tasksite.side_effect.touch' is not a registered task" in error["traceback"]
    assert (added["status"], added["return_value"]) == ("SUCCESSFUL", 42)  # the registry runs

    worker.wait_log(f"task this.nothing [{forged}] FAILED")
    stats = wait_until_blocking(
        lambda: (s := tw.queue(q))["visible"] + s["in_flight"] == 0 and s, "every message ended"
    )
    assert stats["dead"] == 0  # failed and acked, not dead-lettered
    assert not tw.imported.exists(), tw.imported.read_text()  # side_effect never imported
    assert "Beautiful is better than ugly" not in worker.log_text()  # nor ``this``


def test_the_task_modules_setting_adds_to_the_registry(tw: Site, tmp_path: Path) -> None:
    """``LEASECAST_TASK_MODULES`` (here through ``TASKSITE_TASK_MODULES``) registers a
    module that is no app's ``tasks``: imported once, at start, and its tasks run."""
    q = unique("tw")
    imported = tmp_path / "imported"
    touch = tw.driver.enqueue("tests.tasksite.side_effect.touch", q)
    worker = tw.worker(
        q,
        TASKSITE_TASK_MODULES="tests.tasksite.side_effect",
        TASKSITE_IMPORTED=str(imported),
    )
    (result,) = tw.driver.finished(touch)
    assert (result["status"], result["return_value"]) == ("SUCCESSFUL", "touched")
    assert imported.read_text() == f"imported {worker.pid}\n"  # once, by the worker
    assert "tests.tasksite.side_effect" in worker.log_text()  # named in the start line


def test_a_task_module_that_cannot_be_imported_stops_the_worker_at_start(tw: Site) -> None:
    worker = tw.worker(unique("tw"), TASKSITE_TASK_MODULES="tests.tasksite.unimportable")
    assert worker.proc.wait(30) == 1
    text = worker.log_text()
    assert "CommandError: cannot import tests.tasksite.unimportable" in text, text
    assert "LEASECAST_TASK_MODULES" in text and "not installed on this worker" in text
    assert "Traceback" not in text  # one clear line, not a stack


def test_priorities_are_respected(tw: Site, tmp_path: Path) -> None:
    q = unique("tw")
    mark = tmp_path / "marks"
    ids = [
        tw.driver.enqueue("record", q, "low", str(mark), priority=-5),
        tw.driver.enqueue("record", q, "middle", str(mark)),
        tw.driver.enqueue("record", q, "high", str(mark), priority=5),
    ]
    tw.worker(q, concurrency=1)
    results = tw.driver.finished(*ids)
    assert [r["return_value"] for r in results] == ["low", "middle", "high"]
    assert [name for name, _ in marks(mark)] == ["high", "middle", "low"]


def test_a_long_task_keeps_its_lease_and_a_killed_worker_s_task_runs_again(
    tw: Site, tmp_path: Path
) -> None:
    q = unique("tw")
    tw.configure(q, visibility_timeout=1)
    mark, release = tmp_path / "marks", tmp_path / "release"
    rid = tw.driver.enqueue("block", q, str(mark), str(release))
    first = tw.worker(q)
    wait_until_blocking(lambda: marks(mark), "the task to start")
    second = tw.worker(q)
    second.wait_log(f"queue {q}: connected")
    # Three visibility timeouts: without extensions the idle second worker
    # would have been given the message.
    time.sleep(3)
    assert marks(mark) == [("start", first.pid)]
    assert tw.queue(q)["in_flight"] == 1

    first.proc.send_signal(signal.SIGKILL)
    wait_until_blocking(lambda: len(marks(mark)) == 2, "the task to start again")
    assert marks(mark) == [("start", first.pid), ("start", second.pid)]
    release.touch()
    (result,) = tw.driver.finished(rid)
    assert (result["status"], result["return_value"]) == ("SUCCESSFUL", "released")
    assert result["worker_ids"][-1].endswith(f":{second.pid}")


@pytest.mark.parametrize("multiplier", [1, 3])
def test_a_worker_holds_its_prefetch_and_keeps_the_waiting_leases(
    tw: Site, tmp_path: Path, multiplier: int
) -> None:
    """Concurrency 1 and LEASECAST_WORKER_PREFETCH_MULTIPLIER M: M leases held,
    one task running; the waiting ones keep their leases (extended, though the
    lease is 1 s) and run in turn, each once."""
    q = unique("tw")
    tw.configure(q, visibility_timeout=1)
    mark, release = tmp_path / "marks", tmp_path / "release"
    ids = [tw.driver.enqueue("block", q, str(mark), str(release)) for _ in range(4)]
    worker = tw.worker(q, concurrency=1, LEASECAST_WORKER_PREFETCH_MULTIPLIER=str(multiplier))
    worker.wait_log(f"concurrency 1 (holding up to {multiplier})")
    wait_until_blocking(lambda: marks(mark), "the first task to start")
    wait_until_blocking(lambda: tw.queue(q)["in_flight"] == multiplier, f"{multiplier} leases held")
    # Three lease lengths: leases not extended would have expired, and their
    # messages been delivered again (started twice, or counted visible).
    time.sleep(3)
    doc = tw.queue(q)
    assert (doc["in_flight"], doc["visible"]) == (multiplier, 4 - multiplier)
    assert marks(mark) == [("start", worker.pid)]
    release.touch()
    results = tw.driver.finished(*ids)
    assert [r["status"] for r in results] == ["SUCCESSFUL"] * 4
    assert sorted(marks(mark)) == sorted([("start", worker.pid), ("end", worker.pid)] * 4)


def test_a_prefetch_multiplier_out_of_range_stops_the_worker_at_start(tw: Site) -> None:
    worker = tw.worker(unique("tw"), LEASECAST_WORKER_PREFETCH_MULTIPLIER="0")
    assert worker.proc.wait(30) == 1
    assert "LEASECAST_WORKER_PREFETCH_MULTIPLIER must be an int from 1 to 100, got 0" in (
        worker.log_text()
    )


def test_sigterm_lets_the_running_task_finish_then_exits_0(tw: Site, tmp_path: Path) -> None:
    q = unique("tw")
    mark, release = tmp_path / "marks", tmp_path / "release"
    running = tw.driver.enqueue("block", q, str(mark), str(release))
    waiting = tw.driver.enqueue("record", q, "waiting", str(mark))
    worker = tw.worker(q, concurrency=1)
    wait_until_blocking(lambda: marks(mark), "the task to start")
    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_log("stopping: no new tasks")
    release.touch()
    assert worker.proc.wait(30) == 0, worker.log_text()[-3000:]

    (result,) = tw.driver.finished(running)
    assert (result["status"], result["return_value"]) == ("SUCCESSFUL", "released")
    # The worker took nothing new; what it held went back to the queue.
    assert [name for name, _ in marks(mark)] == ["start", "end"]
    assert tw.driver.result(waiting)["status"] == "READY"
    wait_until_blocking(lambda: tw.queue(q)["visible"] == 1, "the waiting task to be visible again")


def test_a_task_still_running_after_the_grace_is_released_and_the_worker_exits(
    tw: Site, tmp_path: Path
) -> None:
    q = unique("tw")
    mark, release = tmp_path / "marks", tmp_path / "release"
    rid = tw.driver.enqueue("block", q, str(mark), str(release))
    worker = tw.worker(q, concurrency=1, grace=0.5)
    wait_until_blocking(lambda: marks(mark), "the task to start")
    worker.proc.send_signal(signal.SIGTERM)
    # The task never finishes (nothing creates the release file): the worker
    # must leave anyway, its thread abandoned, and the message be released.
    assert worker.proc.wait(30) == 0, worker.log_text()[-3000:]
    assert "did not finish within the grace" in worker.log_text()
    wait_until_blocking(lambda: tw.queue(q)["visible"] == 1, "the message to be released")
    assert tw.driver.result(rid)["status"] == "READY"
    assert [name for name, _ in marks(mark)] == ["start"]


def test_a_gateway_restart_mid_task_loses_nothing_and_runs_it_once(
    tw: Site, tmp_path: Path
) -> None:
    q = unique("tw")
    tw.configure(q, visibility_timeout=2)
    mark, release = tmp_path / "marks", tmp_path / "release"
    rid = tw.driver.enqueue("block", q, str(mark), str(release))
    worker = tw.worker(q, concurrency=2)
    wait_until_blocking(lambda: marks(mark), "the task to start")
    tw.gateway.stop()
    tw.gateway.start()
    # The message comes back to the reconnected worker, which adopts the run
    # still going rather than starting it twice.
    worker.wait_log("delivered again while still running here")
    release.touch()
    (result,) = tw.driver.finished(rid)
    assert (result["status"], result["return_value"]) == ("SUCCESSFUL", "released")
    assert [name for name, _ in marks(mark)] == ["start", "end"]
    after = tw.driver.enqueue("add", q, 1, 2)
    (result,) = tw.driver.finished(after)
    assert result["return_value"] == 3
    assert worker.proc.poll() is None


# -- protocol 1.2, Tasks: progress on the task's topic, and cancel ---------------------


def test_progress_and_the_outcome_reach_the_task_topic(tw: Site) -> None:
    """``progress()`` publishes RUNNING on ``task.RESULT_ID``, the outcome follows,
    and the topic keeps them (the last 100, for an hour) for a page that opens late."""
    q = unique("tw")
    tw.configure(q, max_deliveries=1)
    ok = tw.driver.enqueue("steps", q, 3)
    bad = tw.driver.enqueue("fail", q)
    tw.worker(q)
    tw.driver.finished(ok, bad)

    assert tw.topic_ends(ok) == [
        {"status": "RUNNING", "progress": {"step": 0}},
        {"status": "RUNNING", "progress": {"step": 1}},
        {"status": "RUNNING", "progress": {"step": 2}},
        {"status": "SUCCESSFUL", "return_value": "3 steps"},
    ]
    assert tw.topic_ends(bad) == [{"status": "FAILED", "error": "builtins.ValueError: boom"}]
    status, doc = http("GET", f"{tw.gateway.http}/api/topics/task.{ok}", tw.admin)
    assert status == 200, doc
    assert (doc["history_size"], doc["history_ttl"], doc["offset"]) == (100, 3600.0, 4)


def test_cancel_mid_task_cancels_an_async_task_and_tells_a_sync_one(
    tw: Site, tmp_path: Path
) -> None:
    q = unique("tw")
    mark = str(tmp_path / "marks")
    in_async = tw.driver.enqueue("async_until_cancelled", q, mark=mark)
    in_sync = tw.driver.enqueue("sync_until_cancelled", q, mark=mark)
    worker = tw.worker(q, concurrency=2)
    for result_id in (in_async, in_sync):
        wait_until_blocking(lambda r=result_id: tw.topic(r), f"task.{result_id} running")
        assert tw.driver.call(op="cancel", id=result_id) == {"cancelled": True}

    for result_id in (in_async, in_sync):
        *_, end = tw.topic_ends(result_id)
        assert end["status"] == "FAILED"
        assert end["error"].startswith("leasecast.errors.Cancelled: the task was cancelled")
        result = tw.driver.result(result_id)
        assert result["status"] == "FAILED"
        assert result["errors"][-1]["exception_class_path"] == "leasecast.errors.Cancelled"
        assert tw.driver.call(op="cancel", id=result_id) == {"cancelled": False}  # dead already
    # The async task got CancelledError; the sync one saw cancelled() and returned.
    assert sorted(name for name, _ in marks(tmp_path / "marks")) == [
        "async-cancelled",
        "sync-saw-cancelled",
    ]
    stats = tw.queue(q)
    assert (stats["dead"], stats["visible"], stats["in_flight"]) == (2, 0, 0)
    assert "CANCELLED" in worker.log_text()
    assert worker.proc.poll() is None


def test_a_sync_task_that_ignores_its_cancel_is_abandoned_after_the_grace(
    tw: Site, tmp_path: Path
) -> None:
    q = unique("tw")
    release = tmp_path / "release"
    stuck = tw.driver.enqueue("sync_ignores_cancel", q, str(release))
    waiting = tw.driver.enqueue("add", q, 1, 2)  # waits for a slot: concurrency 1
    tw.worker(q, concurrency=1, grace=1.0)
    wait_until_blocking(lambda: tw.topic(stuck), f"task.{stuck} running")
    assert tw.driver.call(op="cancel", id=stuck) == {"cancelled": True}

    *_, end = tw.topic_ends(stuck)
    assert end["status"] == "FAILED"
    assert end["error"].startswith("leasecast.errors.Cancelled: ")
    assert "abandoned" in end["error"]
    # Its slot is free again: the next task runs while the abandoned thread still does.
    (added,) = tw.driver.finished(waiting)
    assert (added["status"], added["return_value"]) == ("SUCCESSFUL", 3)
    release.touch()


def test_a_waiting_task_cancelled_by_message_id_is_told_failed_on_its_topic(tw: Site) -> None:
    """The queue's cancel (HTTP here; the admin and the dashboard use the same
    rule) of a task no worker holds: its page hears FAILED, as after
    ``gateway.tasks.cancel`` (before, only the result said so)."""
    q = unique("tw")
    result_id = tw.driver.enqueue("add", q, 1, 1)
    status, page = http("GET", f"{tw.gateway.http}/api/queues/{q}/messages", tw.admin)
    assert status == 200, page
    (message,) = page["messages"]
    url = f"{tw.gateway.http}/api/queues/{q}/messages/{message['id']}/cancel"
    status, doc = http("POST", url, tw.admin)
    assert (status, doc) == (200, {"cancelled": 1})
    error = "leasecast.errors.Cancelled: the task was cancelled before it ran"
    assert tw.topic_ends(result_id) == [{"status": "FAILED", "error": error}]
    assert tw.driver.result(result_id)["status"] == "FAILED"


def test_a_task_cancelled_before_it_runs_never_runs(tw: Site, tmp_path: Path) -> None:
    q = unique("tw")
    mark = str(tmp_path / "marks")
    result_id = tw.driver.enqueue("add", q, 1, 1, mark=mark)
    assert tw.driver.call(op="cancel", id=result_id) == {"cancelled": True}
    result = tw.driver.result(result_id)
    assert result["status"] == "FAILED"
    assert result["errors"][-1]["exception_class_path"] == "leasecast.errors.Cancelled"
    # The driver is no gateway: it told the topic over HTTP (LEASECAST_URL).
    error = "leasecast.errors.Cancelled: the task was cancelled before it ran"
    assert tw.topic_ends(result_id) == [{"status": "FAILED", "error": error}]
    after = tw.driver.enqueue("add", q, 2, 2, mark=mark)
    tw.worker(q)
    tw.driver.finished(after)
    assert marks(tmp_path / "marks") and {n for n, _ in marks(tmp_path / "marks")} == {"add"}
    assert len(marks(tmp_path / "marks")) == 1  # only the second one ran
