"""Moved to ``inductor_glue.patching`` (Inductor glue shared by capture, workers and the hook).

This name stays for existing imports: it is the very same module object, so
attributes, private helpers and monkeypatching all keep working.
"""

from __future__ import annotations

import sys

from inductor_glue import patching as _moved

sys.modules[__name__] = _moved
