"""The installed wheel: one top-level name, and no Ray needed to warm-start.

.ci/run builds the wheel with `pip wheel --no-deps`, installs it (with the [postgres] extra
only) into a fresh venv on the oldest supported torch, and runs the fast subset there with
AUTOTUNE_TEST_WHEEL naming the wheel. Elsewhere (an editable install) there is no wheel to
look at, and this module says so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import autotune

pytestmark = [
    pytest.mark.torch_subset,
    pytest.mark.skipif(not os.environ.get("AUTOTUNE_TEST_WHEEL"),
                       reason="runs in .ci/run's venv built from the wheel (AUTOTUNE_TEST_WHEEL unset here: an "
                              "editable install has no wheel to check)"),
]

# The distribution is inductor-autotune (the package index's `autotune` is another project's);
# its one import name is autotune.
DIST_INFO = f"inductor_autotune-{autotune.__version__}.dist-info"
OURS = {"autotune", DIST_INFO}


def _top_level(names: list[str]) -> set[str]:
    return {name.split("/")[0] for name in names}


def test_the_wheel_installs_only_autotune_and_its_dist_info() -> None:
    wheel = zipfile.ZipFile(os.environ["AUTOTUNE_TEST_WHEEL"])
    assert _top_level(wheel.namelist()) == OURS
    top_level = next(name for name in wheel.namelist() if name.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["autotune"]
    # What pip put into site-packages: the same two names, and our code is imported from there.
    files = importlib.metadata.distribution("inductor-autotune").files or []
    assert _top_level([str(f) for f in files if not str(f).startswith("..")]) == OURS
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(autotune.__file__).resolve().is_relative_to(site), autotune.__file__


def test_ray_is_not_installed_in_the_wheels_venv() -> None:
    """The [sweep] extra was left out: the hook tests of this subset warm-start without Ray."""
    assert importlib.util.find_spec("ray") is None, sys.prefix


def test_the_wheel_carries_the_license_and_declares_it() -> None:
    wheel = zipfile.ZipFile(os.environ["AUTOTUNE_TEST_WHEEL"])
    assert wheel.read(f"{DIST_INFO}/licenses/LICENSE").decode().startswith("BSD 3-Clause License")
    metadata = wheel.read(f"{DIST_INFO}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata.splitlines()
    assert "Name: inductor-autotune" in metadata.splitlines()
    assert "Requires-Dist: torch>=2.11" in metadata.splitlines(), "a ceiling on torch would make pip replace a newer one"
