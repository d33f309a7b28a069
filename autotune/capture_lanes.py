"""Capture several models at once, one fresh process per GPU, their requests streamed back.

Capture compiles each model once in dry-run mode: seconds to a minute of CPU work per model,
which the sweep did one model after another in its own process, while the GPUs waited for
the requests. With several GPUs, each takes a model at a time (``python -m
autotune.capture_lanes``, pinned to it by CUDA_VISIBLE_DEVICES: capture times padding verdicts
on its GPU), and every request goes to the sweep as it is found, as an in-process capture's
does. A capture process that fails leaves its model to the sweep's own process (``failed``),
which captures it as before: this never makes a sweep worse than capturing in turn.
"""

from __future__ import annotations

import json
import logging
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


def capture_side_by_side(specs: list[CaptureSpec], lanes: int) -> Generator[Found, None, None]:
    """Capture every spec, ``lanes`` processes at a time, each spec on its own lane's GPU;
    yield each request as found and each capture's end, in the order they come. Closing the
    generator early (the sweep stopped) ends the processes still running and starts no more."""
    from .pointwise import lane_gpus

    inbox: queue.Queue[Found] = queue.Queue()
    work = _Work(list(specs))
    for gpu in lane_gpus(lanes):
        threading.Thread(target=work.lane, args=(gpu, inbox.put), name="autotune-capture-lane", daemon=True).start()
    ended = 0
    try:
        while ended < len(specs):
            found = inbox.get()
            ended += found.done
            yield found
    finally:
        work.stop()


class _Work:
    """The specs not begun and the processes running, shared by the lanes."""

    def __init__(self, waiting: list[CaptureSpec]) -> None:
        self.waiting = waiting
        self.running: list[subprocess.Popen[str]] = []
        self.stopped = False
        self._lock = threading.Lock()

    def lane(self, gpu: str | None, send: Callable[[Found], None]) -> None:
        while True:
            with self._lock:
                if self.stopped or not self.waiting:
                    return
                spec = self.waiting.pop(0)
            _run_one(CaptureSpec(spec.model_path, spec.entry, spec.kwargs, spec.pad_decisions, gpu), send, self)

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


def _run_one(spec: CaptureSpec, send: Callable[[Found], None], work: _Work) -> None:
    """One capture process, its lines turned into ``Found``; its end sent whatever happens."""
    from autotune.workers.child import clean_environment

    env = clean_environment()
    if spec.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec.gpu
    result: dict[str, Any] | None = None
    bad_input: str | None = None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "autotune.capture_lanes", json.dumps(spec.__dict__)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)
        work.started(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_REQUEST):
                data = json.loads(line[len(_REQUEST):])
                send(Found(spec.model_path, TuningRequest.from_json(data["request"]),
                           Environment.from_json(data["env"]) if data["env"] else None))
            elif line.startswith(_DONE):
                result = json.loads(line[len(_DONE):])
            elif line.startswith(_BAD_INPUT):
                bad_input = json.loads(line[len(_BAD_INPUT):])
        if proc.wait() != 0 and bad_input is None and not work.stopped:
            log.warning("capturing %s in its own process failed (exit %s); capturing it in the sweep's",
                        spec.model_path, proc.returncode)
            result = None
    except Exception as exc:  # noqa: BLE001 - the sweep captures the model itself instead
        if not work.stopped:
            log.warning("capturing %s in its own process failed (%s); capturing it in the sweep's", spec.model_path, exc)
        result = None
    send(Found(spec.model_path, result=result, done=True, bad_input=bad_input))


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
    }), flush=True)
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return _serve(CaptureSpec(**json.loads(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
