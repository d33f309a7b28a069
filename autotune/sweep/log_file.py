"""The sweep's log file: where everything the libraries underneath a sweep print goes.

Inductor prints an ``AUTOTUNE`` table and its choices' stats for every request it tunes,
Dynamo and torch warn, Ray logs, and the tuning processes print what they like: hundreds
of lines for a GPU sweep, among which a user could not tell whether anything went wrong.
Inside ``SweepLog`` the process's own standard output and error (the file descriptors,
so its child processes, spares and end-to-end passes too) write to one log file per
sweep, and the sweep's actors send theirs and their children's there too
(``workers/actor.py``). The terminal keeps the sweep's own lines: the caller writes them
to ``terminal_out`` and ``terminal_err``, where stdout and stderr went before, and puts
its own handler for autotune's warnings there. Everything autotune logs goes to the file.

The file is made only once the sweep's input was checked (cli.py): a mistake told before
anything starts leaves no log. An error that stops the sweep later ends its log, with its
traceback, so that the log of a failed sweep says why it failed.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO

from autotune.cache.text import escape_control
from autotune.cache.url import default_cache_path, local_directory

log = logging.getLogger(__name__)

_POLL_S = 0.1  # how often -v copies new lines of the log to the terminal


class LogUnavailable(Exception):
    """The log file cannot be created where it was asked for."""


def log_paths(log: str | None, cache_url: str | None) -> list[Path]:
    """Where the sweep's log may go, in order: ``log`` if given (only there), else a new file
    in ``logs/`` beside the SQLite cache file, or (a server database; a full or read-only
    disk there) under $XDG_CACHE_HOME/autotune/logs, or the temporary directory."""
    if log:
        return [Path(log)]
    name = f"sweep-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
    folders = [local_directory(cache_url) / "logs", default_cache_path().parent / "logs",
               Path(tempfile.gettempdir()) / "autotune-logs"]
    return [folder / name for folder in dict.fromkeys(folders)]


def _open_log(paths: list[Path]) -> tuple[Path, int]:
    """The first of ``paths`` that takes its first line (a full disk creates the file, then
    refuses the line), and its descriptor."""
    header = f"autotune sweep log, {datetime.now():%Y-%m-%d %H:%M:%S}: {' '.join(sys.argv)}\n".encode()
    problems = []
    for path in paths:
        fd = -1
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, header)
            return path, fd
        except OSError as error:
            problems.append(f"{path}: {error.strerror}")
            if fd >= 0:
                os.close(fd)
                path.unlink(missing_ok=True)
    raise LogUnavailable(f"cannot write the sweep's log ({'; '.join(problems)}); "
                         "pass --log PATH (or set AUTOTUNE_LOG) to a writable file")


class _Tail:
    """Copies each new line of the log to ``echo`` as it is written (``-v``)."""

    def __init__(self, path: Path, echo: Callable[[str], None]) -> None:
        self.file = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by stop()
        self.file.seek(0, os.SEEK_END)
        self.echo = echo
        self.partial = ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="autotune-log-tail", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(_POLL_S):
            self._copy()

    def _copy(self) -> None:
        text = self.partial + self.file.read()
        *lines, self.partial = text.split("\n")
        for line in lines:
            self.echo(line)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._copy()
        if self.partial:
            self.echo(self.partial)
        self.file.close()


def _terminal(stream: IO[str], fd: int, saved: int) -> IO[str]:
    """A stream to where ``stream`` writes now: over ``saved`` (a copy of descriptor ``fd``)
    if ``stream`` writes to ``fd``, else ``stream`` itself (a test runner's buffer)."""
    stream.flush()
    try:
        own = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        own = False
    if not own:
        return stream
    return open(saved, "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",  # noqa: SIM115
                errors="replace", closefd=False)


class _LogStream(io.TextIOWrapper):
    """sys.stdout or sys.stderr inside ``SweepLog``: written through to a descriptor (the log),
    and what a full disk refuses is dropped, not raised into the code that printed it. Never
    closed: a handler made meanwhile may hold one, and write to the terminal again after."""

    def __init__(self, fd: int) -> None:
        super().__init__(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="replace",
                         line_buffering=True, write_through=True)

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            pass


def _record_failure(error: BaseException) -> None:
    """The error that stops the sweep, at the end of its log (stderr is the log here): its one
    line as the terminal shows it, then where it came from."""
    if isinstance(error, SystemExit) and error.code in (0, None):
        return
    if isinstance(error, KeyboardInterrupt):
        line = "the sweep was interrupted (Ctrl-C)"
    else:
        line = f"the sweep stopped: {type(error).__name__}: {str(error).strip() or '-'}"
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    lines = [" ".join(line.split()), *text.splitlines()]
    try:
        sys.stderr.write("".join(escape_control(each) + "\n" for each in lines))
        sys.stderr.flush()
    except (OSError, ValueError):  # a full disk: the terminal has the line anyway
        pass


class SweepLog:
    """Inside: stdout, stderr and autotune's log records go to ``path``; ``terminal_out``
    and ``terminal_err`` write where stdout and stderr went before."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths  # log_paths(): the first that can be written is used
        self.path = paths[0]
        self.terminal_out: IO[str] = sys.stdout
        self.terminal_err: IO[str] = sys.stderr
        self._saved: list[int] = []  # copies of descriptors 1 and 2, put back at the end
        self._streams: tuple[IO[str], IO[str]] = (sys.stdout, sys.stderr)
        self._handler: logging.Handler | None = None
        self._level = logging.NOTSET
        self._tail: _Tail | None = None

    def __enter__(self) -> SweepLog:
        self.path, fd = _open_log(self.paths)
        self._streams = (sys.stdout, sys.stderr)
        self._saved = [os.dup(1), os.dup(2)]
        try:
            self.terminal_out = _terminal(sys.stdout, 1, self._saved[0])
            self.terminal_err = _terminal(sys.stderr, 2, self._saved[1])
            for target in (1, 2):
                os.dup2(fd, target)
            # Python-level writes (warnings, print, torch's handlers) go to the descriptors,
            # even where sys.stdout was a test runner's buffer.
            sys.stdout, sys.stderr = _LogStream(1), _LogStream(2)
            self._log_autotune()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            os.close(fd)
        return self

    def tail(self, echo: Callable[[str], None]) -> None:
        """From now on, hand each line written to the log to ``echo`` as it comes (``-v``)."""
        if self._tail is None:
            self._tail = _Tail(self.path, echo)

    def _log_autotune(self) -> None:
        """Everything autotune logs at INFO and above goes to the file too."""
        logger = logging.getLogger("autotune")
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._level = logger.level
        logger.addHandler(self._handler)
        logger.setLevel(logging.INFO)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if error is not None and self._saved:
            _record_failure(error)
        logger = logging.getLogger("autotune")
        if self._handler is not None:
            logger.removeHandler(self._handler)
            logger.setLevel(self._level)
        sys.stdout.flush()
        sys.stderr.flush()
        if self._tail is not None:
            self._tail.stop()
        for stream, original in zip((self.terminal_out, self.terminal_err), self._streams):
            stream.flush()
            if stream is not original:
                stream.close()  # the copy only: its descriptor is closed below
        sys.stdout, sys.stderr = self._streams
        for target, saved in zip((1, 2), self._saved):
            os.dup2(saved, target)
            os.close(saved)
        self.terminal_out, self.terminal_err = self._streams
