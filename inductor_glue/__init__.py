"""The Inductor glue shared by the sweep's capture, the Ray workers and the warm-start hook.

It patches Inductor's autotune selector (``inductor``), pins which Triton configs are
rendered (``pinning``), computes environment keys (``env``), loads model files
(``modelfile``) and runs the dry-run capture (``capture``); ``seams`` declares every private
torch attribute any of it (or the hook) reads, patches or subclasses. It imports only torch and
``cache``; the coordinator (``autotune``) and the Ray side (``workers``) import it, never
the other way round, so the flow reads cli -> autotune -> workers -> inductor_glue -> cache.
"""
