"""examples/mlp_job.py with the warm-start hook in its code: one call before the first compile."""

from __future__ import annotations

import autotune

handle = autotune.warm_start()  # AUTOTUNE_CACHE, else ~/.cache/autotune/cache.db

from mlp_job import main  # noqa: E402  (the hook goes in before anything compiles)

main()
print(f"autotune: {handle.stats}")
