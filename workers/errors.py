"""Errors of the worker layer, importable without torch or Ray."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """Ray could not be started or joined, or has no worker of the kind needed."""
