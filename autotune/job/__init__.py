"""The job's wing: what a training job runs under ``autotune.warm_start()``.

The hook (hook.py) and its policy (serve_policy.py) answer Inductor's lookups from the store, read
and written through the store client (store_client.py), which the prefetch and the node share use
too; beside them the artifact tier, the kernel configs, the node share and the install's gates.
It imports nothing of the sweep's (tests/test_layout.py). Empty on purpose: importing a module of
this wing loads only what that module needs.
"""
