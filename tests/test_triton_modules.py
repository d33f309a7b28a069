"""Triton's native modules through the artifact tier: published once, then served without a compiler.

Real components: Triton's own ``compile_module_from_src`` (the call its launchers and driver make),
gcc, Ed25519 keys, and the SQL store. Triton needs no GPU to build a module, so this runs on a CPU;
it runs where Triton is installed (the torch 2.11 subset, whose torch wheel brings Triton).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from autotune.cache import Store, signing
from autotune.cache.records import ARTIFACT_TRITON_MODULE
from autotune.job.artifacts import ArtifactSeams, ArtifactTier
from autotune.job.hook_stats import HookStats

pytestmark = pytest.mark.torch_subset

build = pytest.importorskip(
    "triton.runtime.build",
    reason="Triton is not installed here (torch's CPU wheel has none); this file runs in the torch 2.11 subset")

# A C extension as Triton builds them: its name is the module's, its function answers 42.
SOURCE = """
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""


@pytest.fixture
def module_name() -> str:
    return f"probe_{uuid.uuid4().hex[:12]}"


def _compile(name: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, cc: str | None = None) -> Any:
    """Triton's own entry point, with a fresh Triton cache dir (and, given ``cc``, that compiler)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_dir))
    if cc is None:
        return build.compile_module_from_src(SOURCE.replace("NAME", name), name)
    monkeypatch.setenv("CC", cc)
    # Triton 3.9 looks its compiler up once a process (_find_compiler, cached): forgotten before
    # and after, so that this call finds ``cc`` and none after the test does.
    forget = getattr(getattr(build, "_find_compiler", None), "cache_clear", lambda: None)
    forget()
    try:
        return build.compile_module_from_src(SOURCE.replace("NAME", name), name)
    finally:
        forget()


def _tier(store: Store, trusted: signing.TrustedKeys, signer: signing.Signer | None = None) -> ArtifactTier:
    return ArtifactTier(trusted=trusted, signer=signer, device="cpu", stats=HookStats(),
                        call=lambda fn, _timeout: fn(store), submit=lambda work: work(), timeout=2.0)


@pytest.fixture
def installed() -> Iterator[list[ArtifactSeams]]:
    """Seams installed by the test, removed after it whatever happens."""
    held: list[ArtifactSeams] = []
    yield held
    for seams in reversed(held):
        seams.remove()


def _install(installed: list[ArtifactSeams], tier: ArtifactTier) -> ArtifactTier:
    installed.append(ArtifactSeams(tier, dynamo_package=False))
    return tier


def _publish(store: Store, signer: signing.Signer, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             installed: list[ArtifactSeams]) -> None:
    _install(installed, _tier(store, signing.NO_TRUSTED_KEYS, signer))
    assert _compile(name, tmp_path / "publisher", monkeypatch).answer() == 42
    installed.pop().remove()


def test_a_module_triton_builds_is_published_once_and_then_served_without_the_compiler(
        store: Store, signing_keys: dict[str, Path], module_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, installed: list[ArtifactSeams]) -> None:
    _publish(store, signing.load_signer(signing_keys["writer"]), module_name, tmp_path, monkeypatch, installed)
    [stored] = store.artifacts(kind=ARTIFACT_TRITON_MODULE)
    assert module_name in stored.key and stored.key.startswith("triton-")

    # A fresh node whose C compiler would fail: without the tier, Triton cannot build the module.
    with pytest.raises(Exception):  # noqa: B017 - Triton's CalledProcessError or its fallback's error
        _compile(module_name, tmp_path / "without", monkeypatch, cc="/bin/false")
    tier = _install(installed, _tier(store, signing.load_trusted([signing_keys["writer.pub"]])))
    assert _compile(module_name, tmp_path / "fresh", monkeypatch, cc="/bin/false").answer() == 42
    assert (tier.stats.artifacts_loaded, tier.stats.artifacts_rejected) == (1, 0)


def test_a_module_from_an_untrusted_signer_is_built_instead(
        store: Store, signing_keys: dict[str, Path], module_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, installed: list[ArtifactSeams]) -> None:
    _publish(store, signing.load_signer(signing_keys["stranger"]), module_name, tmp_path, monkeypatch, installed)
    tier = _install(installed, _tier(store, signing.load_trusted([signing_keys["writer.pub"]])))
    assert _compile(module_name, tmp_path / "fresh", monkeypatch).answer() == 42
    assert (tier.stats.artifacts_loaded, tier.stats.artifacts_rejected) == (0, 1)


def test_a_signed_module_this_machine_cannot_load_is_built_instead(
        store: Store, signing_keys: dict[str, Path], module_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, installed: list[ArtifactSeams]) -> None:
    writer = signing.load_signer(signing_keys["writer"])
    _publish(store, writer, module_name, tmp_path, monkeypatch, installed)
    [stored] = store.artifacts(kind=ARTIFACT_TRITON_MODULE)
    garbage = b"\x7fELF but not a library"
    with store._engine().begin() as conn:  # a trusted writer stored bytes no dlopen takes
        conn.execute(sa.text("UPDATE artifacts SET payload = :p, signature = :s, size = :n"),
                     {"p": garbage, "s": writer.sign(ARTIFACT_TRITON_MODULE, stored.key, garbage), "n": len(garbage)})
    _install(installed, _tier(store, signing.load_trusted([signing_keys["writer.pub"]])))
    assert _compile(module_name, tmp_path / "fresh", monkeypatch).answer() == 42
