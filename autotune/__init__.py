"""autotune: ahead-of-time max-autotune sweeps and a shared SQL kernel cache for torch.compile.

``import autotune`` stays light: nothing heavy (torch, Ray, SQLAlchemy) is
imported until a function that needs it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["warm_start", "__version__"]

if TYPE_CHECKING:
    from .job.hook import WarmStart


def warm_start(cache: str | None = None, *, on_miss: str | None = None, write_back: bool | None = None,
               read_only: bool = False, **kwargs: Any) -> WarmStart:
    """Serve torch.compile's autotune lookups from the cache; see autotune.job.hook.warm_start.

    The hook installs on the caller's thread before this returns, and patches nothing of the
    interpreter's; only the prefetch (the cache's reads and the artifacts' checks) runs on a
    thread, which ends with it. ``AUTOTUNE_BACKGROUND_INSTALL=1`` (off by default, on every
    machine) opts in to the install on a thread instead: it returns at once, and
    ``torch.compile``, Inductor's selector and the script's imports of torch's modules wait for
    the install (autotune/job/background.py, autotune/job/import_gate.py; docs/guide.md says why it is
    not the default). Bad settings and key files raise here either way."""
    import sysconfig
    from typing import cast

    from .settings import load_keys, warm_start_settings

    settings = warm_start_settings(cache, on_miss=on_miss, write_back=write_back, read_only=read_only, **kwargs)
    # Python before 3.13 fills its config variables at their first use without a lock, and the
    # warm start's threads read them (importing Triton reads EXE): another thread reading them
    # meanwhile got None, which failed an install (torch 2.11, Python 3.11). Filled here, before
    # any of those threads starts, they are only read.
    sysconfig.get_config_vars()

    def install() -> WarmStart:
        from .job.hook import _install

        return _install(settings)  # a bad key file raises KeyFileError before anything is installed

    if not (settings.prefetch and settings.background_install):
        return _timed(install)
    from .job import import_gate

    if not import_gate.install():  # a Python whose imports it cannot hold: install here
        return _timed(install)
    from .job.background import PendingWarmStart

    load_keys(settings)  # the thread would read them too late to raise in the caller

    # It answers every attribute of a WarmStart, once installed.
    return cast("WarmStart", PendingWarmStart(install, early=_start_beside_imports))


def _start_beside_imports() -> None:
    """With the install on a thread (the opt-in) only: work the hook needs that needs no Inductor,
    on threads of its own, started before Inductor's imports so that it runs beside them: the
    store's imports (which take turns with those imports on the GIL: autotune/job/store_imports.py
    says why they start here all the same) and Triton's key (file reads and hashing, which hold
    the GIL little). The default start-up starts neither."""
    from .inductor_glue.env import prewarm_triton_key
    from .job import exit_wait, store_imports

    store_imports.start()
    hashing = prewarm_triton_key()  # never raises
    if hashing is not None:  # a script that ends at once: the hashing ends before the interpreter does
        exit_wait.finish_before_exit(hashing)


def _timed(install: Callable[[], WarmStart]) -> WarmStart:
    """The install before ``warm_start()`` returns, its seconds in the handle's stats. It starts
    no thread of its own: the store's modules are imported by the prefetch's thread (or the
    first lookup), Triton's key by the first compile (autotune/job/store_imports.py)."""
    import time

    began = time.perf_counter()
    handle = install()
    handle.stats.install_s = time.perf_counter() - began
    return handle
