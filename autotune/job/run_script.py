"""``autotune run SCRIPT.py ARGS``: run a script as ``python SCRIPT.py ARGS`` with the hook on."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from autotune import warm_start
from autotune.cache.errors import find_cause
from autotune.settings import Settings

from .hook_stats import CacheMissError, HookStats


def run_script(script: str, args: list[str], settings: Settings) -> tuple[int, HookStats]:
    """Run ``script`` in this process under warm_start; return (exit code, hook stats).

    A miss under ``on_miss="error"`` raises CacheMissError itself, out of the wrappers
    torch puts around an error in a compile (its message is the line a user needs). The hook
    installs as ``autotune.warm_start()`` installs it: before the script starts, or on a thread
    beside it with the opt-in (``Settings.background_install``)."""
    path = Path(script)
    handle = warm_start(settings.cache, on_miss=settings.on_miss, write_back=settings.write_back,
                        read_only=settings.read_only, settings=settings)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))  # as `python SCRIPT.py` would
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except Exception as exc:
        miss = find_cause(exc, CacheMissError)
        if miss is None:
            raise
        raise miss from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        stats = handle.stats
        handle.uninstall()
    return code, stats
