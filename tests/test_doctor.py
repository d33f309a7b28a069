"""`autotune doctor`'s warnings and reports, the one version, and the license in the metadata.

The features' verdicts (a seam deleted, the exit status 1) are tests/test_seams.py's.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import autotune
from autotune import cli, doctor

# The fast subset CI also runs on the oldest supported torch (.ci/run).
pytestmark = pytest.mark.torch_subset

REPO = Path(__file__).resolve().parents[1]
# Lines of PyPI's torch wheels' METADATA, as importlib.metadata.requires('torch') gives them.
TORCH_211_TRITON = 'triton==3.6.0; platform_system == "Linux"'
TORCH_215_TRITON = 'triton~=3.9.0; platform_system == "Linux" and python_version < "3.16"'


def _doctor(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli.main, ["doctor", "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.output)


def _pyproject() -> dict[str, Any] | None:
    """pyproject.toml, where the checkout is here (the torch subset runs from a copy of the tests)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    path = REPO / "pyproject.toml"
    return tomllib.loads(path.read_text()) if path.exists() else None


def test_a_torch_release_not_tested_is_a_warning_with_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "TESTED_TORCH", ("1.0",))
    code, report = _doctor()
    assert code == 0 and report["ok"] and not report["torch_tested"]
    (warning,) = [w for w in report["warnings"] if "was not tested" in w]
    assert report["torch"] in warning and "tested: 1.0" in warning
    text = CliRunner().invoke(cli.main, ["doctor"])
    assert text.exit_code == 0 and "(not tested)" in text.output.splitlines()[0]
    assert f"warning: {warning}" in text.output.splitlines()


def test_the_torch_here_is_a_tested_release_and_gets_no_warning_for_it() -> None:
    code, report = _doctor()
    assert report["torch_tested"], f"torch {report['torch']} is not in TESTED_TORCH {doctor.TESTED_TORCH}"
    assert not [w for w in report["warnings"] if "was not tested" in w] and code == 0


def test_triton_pin_reads_torchs_requirement_for_this_platform() -> None:
    linux = sys.platform == "linux"
    assert doctor.triton_pin(["numpy", "triton==3.7.0"]) == "==3.7.0"
    assert doctor.triton_pin(["sympy>=1.13", TORCH_211_TRITON]) == ("==3.6.0" if linux else None)
    assert doctor.triton_pin(["sympy>=1.13", TORCH_215_TRITON]) == ("~=3.9.0" if linux else None)
    assert doctor.triton_pin(['triton==3.7.0; platform_system == "Windows"']) is None
    assert doctor.triton_pin(["sympy>=1.13", 'nvidia-nccl-cu13==2.28; platform_system == "Linux"']) is None


def test_triton_matches_follows_the_pins_specifier() -> None:
    assert doctor.triton_matches("3.6.0", "==3.6.0") and not doctor.triton_matches("3.8.0", "==3.6.0")
    assert doctor.triton_matches("3.9.2", "~=3.9.0") and not doctor.triton_matches("3.8.0", "~=3.9.0")
    assert not doctor.triton_matches("3.10.0", "~=3.9.0")
    assert doctor.triton_matches(None, None) and doctor.triton_matches("3.8.0", None)
    assert not doctor.triton_matches(None, "~=3.9.0")


def test_a_triton_other_than_torchs_pin_is_a_warning_with_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_torch_requires", lambda: ["triton==0.0.1"])
    code, report = _doctor()
    assert code == 0 and report["triton_pinned"] == "==0.0.1"
    (warning,) = [w for w in report["warnings"] if "pins" in w]
    assert warning.startswith(f"triton {report['triton']} is not the triton==0.0.1 torch ") and "'triton==0.0.1'" in warning


def test_the_triton_installed_matches_torchs_pin_here() -> None:
    """The install CI made: pip kept torch's own pin (or the CPU build pins none)."""
    _, report = _doctor()
    assert doctor.triton_matches(None if report["triton"] == "not installed" else report["triton"],
                                 report["triton_pinned"]), report
    assert not [w for w in report["warnings"] if "pins" in w]


def test_an_off_feature_is_a_warning_and_the_report_names_autotune_extras_and_compiler() -> None:
    code, report = _doctor()
    assert report["autotune"] == autotune.__version__
    assert set(report["extras"]) == set(doctor.EXTRAS)
    for extra, versions in report["extras"].items():
        for name, version in versions.items():
            import importlib.util

            assert (version is not None) == (importlib.util.find_spec(name) is not None), (extra, name)
    assert report["compiler"]["name"] and Path(report["compiler"]["path"]).exists(), report["compiler"]
    report["features"][0] = {**report["features"][0], "on": False, "instead": "plain max-autotune",
                             "missing": [{"seam": "torch._x.y", "kind": "read", "problem": "gone"}]}
    warned = doctor.warnings(report)
    assert f"{report['features'][0]['name']} is off: no torch._x.y; plain max-autotune" in warned


def test_the_extras_doctor_names_are_pyprojects() -> None:
    project = _pyproject()
    if project is None:
        pytest.skip("no pyproject.toml beside the tests (a copy of the tests runs against the wheel)")
    optional = project["project"]["optional-dependencies"]
    for extra, names in doctor.EXTRAS.items():
        declared = [re.split(r"[\[<>=;!~ ]", requirement, maxsplit=1)[0] for requirement in optional[extra]]
        assert declared == list(names), (extra, optional[extra])
    assert set(doctor.EXTRAS) == {e for e in optional if not any("autotune[" in r for r in optional[e])} - {"lint"}


def test_a_sqlite_cache_not_yet_made_is_reported_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "none" / "cache.db"
    code, report = _doctor("--cache", f"sqlite:///{path}")
    assert code == 0 and not report["cache"]["answers"] and report["cache"]["detail"].startswith("no database at ")
    assert not path.exists() and not path.parent.exists()
    assert not [w for w in report["warnings"] if "cache" in w]


def test_a_sqlite_cache_answers_with_its_schema(sqlite_url: str) -> None:
    from autotune.cache import Store

    with Store(sqlite_url) as store:
        store.connect()
    _, report = _doctor("--cache", sqlite_url)
    assert report["cache"]["answers"] and "schema revision" in report["cache"]["detail"], report["cache"]


def test_the_postgres_cache_answers(postgres_url: str) -> None:
    _, report = _doctor("--cache", postgres_url)
    assert report["cache"]["answers"], report["cache"]
    assert report["cache"]["detail"].startswith("PostgreSQL "), report["cache"]


def test_a_cache_that_does_not_answer_is_a_warning_within_seconds() -> None:
    """A port nobody listens on: the warning names the URL; exit 0 (the torch install is fine)."""
    import socket

    with socket.socket() as sock:  # a free port, closed again: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://postgres:secret@127.0.0.1:{port}/test"
    began = time.monotonic()
    code, report = _doctor("--cache", url)
    assert code == 0 and not report["cache"]["answers"]
    assert report["cache"]["seconds"] < 3 * doctor.CACHE_TIMEOUT_S and time.monotonic() - began < 60
    (warning,) = [w for w in report["warnings"] if w.startswith("the cache ")]
    assert f"127.0.0.1:{port}" in warning and "secret" not in json.dumps(report)


def test_an_unsupported_cache_url_is_bad_input_exit_2() -> None:
    result = CliRunner().invoke(cli.main, ["doctor", "--cache", "mysql://db/kernels"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: unsupported cache database") and "sqlite:///" in lines[0]


def test_the_version_is_written_once_and_autotune_version_prints_it() -> None:
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"autotune, version {autotune.__version__}"
    project = _pyproject()
    if project is None:
        return
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "autotune.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", autotune.__version__)
    assert f"## {autotune.__version__}" in (REPO / "CHANGELOG.md").read_text()


def test_the_license_is_bsd_3_clause_in_the_file_and_the_metadata() -> None:
    project = _pyproject()
    if project is None:
        pytest.skip("no pyproject.toml beside the tests (tests/test_wheel.py reads the wheel's metadata)")
    assert (REPO / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert project["project"]["license"] == "BSD-3-Clause" and project["project"]["license-files"] == ["LICENSE"]
    assert project["project"]["name"] == doctor.DISTRIBUTION
    floor = re.fullmatch(r"setuptools>=(\d+)", project["build-system"]["requires"][0])
    assert floor and int(floor[1]) >= 77, "SPDX license expressions need setuptools 77"
    torch_req = next(r for r in project["project"]["dependencies"] if r.startswith("torch"))
    assert torch_req == "torch>=2.11", "a ceiling would make pip replace a newer torch the user has"



def test_docs_versions_md_is_generated_from_the_install_matrixs_doctor_reports() -> None:
    script = REPO / "docs" / "gen_versions.py"
    if not script.exists():
        pytest.skip("no docs/ beside the tests (a copy of the tests runs against the wheel)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_versions", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = json.loads(module.RESULTS.read_text())
    assert module.PAGE.read_text() == module.render(results), "docs/versions.md is out of date: python docs/gen_versions.py"
    tested = {".".join(row["torch_before"].split(".")[:2]) for row in results["rows"] if row.get("ok")}
    assert set(doctor.TESTED_TORCH) <= tested, "TESTED_TORCH names a release the matrix did not pass"
