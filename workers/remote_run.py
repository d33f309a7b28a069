"""A module of this project run in a fresh process on a Ray node, with the files it needs.

The sweep's end-to-end passes run on its own host's GPUs, and on a cluster (--address) on
the other nodes' GPUs too (autotune/sweep/remote_passes.py): this is the Ray task that runs one
there. The model file travels as text, as remote capture's does, written into a temporary
folder; ``{dir}`` in the arguments names that folder. The process is the same one a local
pass starts (``python -m autotune.sweep.end_to_end``), with this node's GPU, which Ray assigned
to the task.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .actor import _node_id
from .environment import clean_environment


def run_module(module: str, argv: list[str], stdin: str, files: dict[str, str], timeout: float,
               grace: float) -> dict[str, Any]:
    """Run ``python -m module argv`` here, ``stdin`` written to it, ``files`` in ``{dir}``. Past
    ``timeout`` seconds it is sent SIGTERM and given ``grace`` seconds to store what it has and
    report (then killed). Its exit status, stdout and this node's ID."""
    with tempfile.TemporaryDirectory(prefix="autotune-remote-") as folder:
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
        args = [arg.replace("{dir}", folder) for arg in argv]
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=clean_environment(), text=True)
        timed_out = False
        try:
            stdout, _ = proc.communicate(input=stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.terminate()
            try:
                stdout, _ = proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
    return {"rc": proc.returncode, "stdout": stdout, "timed_out": timed_out, "node": _node_id()}
