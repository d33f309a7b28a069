"""Capture several models at once, one process per GPU, their requests streamed back.

Capture compiles each model once in dry-run mode: seconds to a minute of CPU work per model,
which the sweep did one model after another in its own process, while the GPUs waited for
the requests. With several GPUs, each has a process (``python -m autotune.sweep.capture_lanes``,
pinned to it by CUDA_VISIBLE_DEVICES: capture times padding verdicts on its GPU) that takes a
model at a time, and every request goes to the sweep as it is found, as an in-process
capture's does. The processes start with the sweep (``prestart``), so their imports overlap
the sweep's own, and each captures its lane's models in turn, paying its start-up once. A
capture process that fails leaves its model to the sweep's own process (``failed``), which
captures it as before: this never makes a sweep worse than capturing in turn.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from autotune.cache.records import Environment, TuningRequest

log = logging.getLogger(__name__)

_REQUEST = "CAPTURE-REQUEST "
_DONE = "CAPTURE-DONE "
_BAD_INPUT = "CAPTURE-BAD-INPUT "  # the model file's own error (ModelFileError): one line for the user


@dataclass
class CaptureSpec:
    """One model's capture, as plain data (it travels in argv)."""

    model_path: str
    entry: str
    kwargs: dict[str, Any]  # capture_model's keywords (JSON: no distributed spec)
    pad_decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpu: str | None = None


@dataclass
class Found:
    """What a capture process sent: a request, or its end (``result``; None: it failed)."""

    model_path: str
    request: TuningRequest | None = None
    env: Environment | None = None
    result: dict[str, Any] | None = None
    done: bool = False
    bad_input: str | None = None  # the model file cannot be built: its one-line error


def capture_side_by_side(specs: list[CaptureSpec], lanes: int,
                         started: list[LaneProcess] | None = None) -> Generator[Found, None, None]:
    """Capture every spec, ``lanes`` processes at a time, each spec on its own lane's GPU;
    yield each request as found and each capture's end, in the order they come. ``started``:
    processes ``prestart`` began, one per lane, which the lanes use first. Closing the
    generator early (the sweep stopped) ends the processes still running and starts no more."""
    from .end_to_end import lane_gpus

    inbox: queue.Queue[Found] = queue.Queue()
    work = _Work(list(specs))
    ready = list(started or [])
    for gpu in lane_gpus(lanes):
        own = next((p for p in ready if p.gpu == gpu), None)
        if own is not None:
            ready.remove(own)
        threading.Thread(target=work.lane, args=(gpu, inbox.put, own), name="autotune-capture-lane",
                         daemon=True).start()
    for unused in ready:
        unused.kill()
    ended = 0
    try:
        while ended < len(specs):
            found = inbox.get()
            ended += found.done
            yield found
    finally:
        work.stop()


def prestart(lanes: int, cuda: bool) -> list[LaneProcess]:
    """A capture process per lane, started before the sweep has its specs: each imports torch
    and Inductor (and starts CUDA) while the sweep loads its model files and starts Ray, which
    a capture process begun only then made the first requests wait for."""
    from .end_to_end import lane_gpus

    return [LaneProcess(gpu, cuda) for gpu in lane_gpus(lanes)]


class LaneProcess:
    """One lane's capture process: it captures each spec it is sent, one after another, and
    ends when its input closes. One that dies (a crash) leaves its lane to a fresh one."""

    def __init__(self, gpu: str | None, cuda: bool) -> None:
        from autotune.workers.environment import clean_environment

        env = clean_environment()
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.gpu = gpu
        self._ended = False  # its output ended: it died, though the OS may not have reaped it yet
        self.proc = subprocess.Popen([sys.executable, "-m", "autotune.sweep.capture_lanes", *(["--cuda"] if cuda else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    def capture(self, spec: CaptureSpec, send: Callable[[Found], None]) -> tuple[dict[str, Any] | None, str | None]:
        """Capture ``spec``: its requests go to ``send`` as found; then its result and the model
        file's own error, if any. A result of None without an error: the process died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec.__dict__) + "\n")
            self.proc.stdin.flush()
        except OSError:  # it died before this spec
            self._ended = True
            return None, None
        while line := self.proc.stdout.readline():
            if line.startswith(_REQUEST):
                data = json.loads(line[len(_REQUEST):])
                send(Found(spec.model_path, TuningRequest.from_json(data["request"]),
                           Environment.from_json(data["env"]) if data["env"] else None))
            elif line.startswith(_DONE):
                return json.loads(line[len(_DONE):]), None
            elif line.startswith(_BAD_INPUT):
                return None, json.loads(line[len(_BAD_INPUT):])
        self._ended = True
        return None, None

    @property
    def alive(self) -> bool:
        return not self._ended and self.proc.poll() is None

    def kill(self) -> None:
        """Never used (the sweep stopped first, or had fewer lanes): nothing of it is wanted."""
        if self.alive:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """No more specs: it ends by itself; killed if it has not within a few seconds."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class _Work:
    """The specs not begun and the processes running, shared by the lanes."""

    def __init__(self, waiting: list[CaptureSpec]) -> None:
        self.waiting = waiting
        self.running: list[subprocess.Popen[str]] = []
        self.stopped = False
        self._lock = threading.Lock()

    def lane(self, gpu: str | None, send: Callable[[Found], None], process: LaneProcess | None) -> None:
        """The lane's specs, one after another, in its process (started now if it has none, or if
        its last died); its end sent for each whatever happens."""
        if process is not None:
            self.started(process.proc)
        while True:
            with self._lock:
                if self.stopped or not self.waiting:
                    break
                spec = self.waiting.pop(0)
            spec = CaptureSpec(spec.model_path, spec.entry, spec.kwargs, spec.pad_decisions, gpu)
            result, bad_input = None, None
            try:
                if process is None or not process.alive:
                    process = LaneProcess(gpu, spec.kwargs.get("device") == "cuda")
                    self.started(process.proc)
                result, bad_input = process.capture(spec, send)
            except Exception as exc:  # noqa: BLE001 - the sweep captures the model itself instead
                if not self.stopped:
                    log.warning("capturing %s in its own process failed (%s); capturing it in the sweep's",
                                spec.model_path, exc)
            if result is None and bad_input is None and not self.stopped:
                log.warning("capturing %s in its own process failed (exit %s); capturing it in the sweep's",
                            spec.model_path, process.proc.poll() if process is not None else None)
            send(Found(spec.model_path, result=result, done=True, bad_input=bad_input))
        if process is not None:
            process.close()

    def started(self, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self.running.append(proc)
            if self.stopped:  # stopped while it started
                proc.kill()

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            for proc in self.running:
                if proc.poll() is None:
                    proc.kill()


def _serve(spec: CaptureSpec) -> int:
    from autotune.inductor_glue.capture import capture_model
    from autotune.inductor_glue.modelfile import ModelFileError, load_model_file

    def found(request: TuningRequest, env: Environment | None) -> None:
        line = json.dumps({"request": request.to_json(), "env": env.to_json() if env else None})
        print(_REQUEST + line, flush=True)

    began_at = time.time()
    kwargs = dict(spec.kwargs, batch_sizes=tuple(spec.kwargs["batch_sizes"]))
    try:
        model = load_model_file(spec.model_path, spec.entry)
        result = capture_model(model, on_request=found, pad_decisions=spec.pad_decisions, **kwargs)
    except ModelFileError as exc:
        print(_BAD_INPUT + json.dumps(str(exc)), flush=True)
        return 2
    print(_DONE + json.dumps({
        "env": result.env.to_json() if result.env else None,
        "requests": len(result.requests),
        "seconds": result.seconds,
        "total_lookups": result.total_lookups,
        "pad_decisions": result.pad_decisions,
        "began_at": began_at,
        "ended_at": time.time(),
        "pid": os.getpid(),  # which lane process captured it (one captures its lane's models in turn)
    }), flush=True)
    return 0


def main(argv: list[str]) -> int:
    """A lane's process: the imports first, then each spec read from stdin, one per line,
    captured in turn; a spec whose capture raises ends the process (its lane starts another)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import torch

    import autotune.inductor_glue.capture  # noqa: F401 - imported now, before the first spec comes

    if "--cuda" in argv and torch.cuda.is_available():
        torch.cuda.init()
    for line in sys.stdin:
        if line.strip():
            _serve(CaptureSpec(**json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
