"""A torch without one seam: runs `autotune doctor --json`, then tests/hook_job.py, in one process.

usage: python seam_job.py SEAM DOCTOR.json HOOK_JOB_ARGS...

SEAM is a declared seam's path (inductor_glue/seams.py); it is deleted from its owner,
as a torch that renamed it would lack it. The doctor's exit status and report go to
DOCTOR.json; the job then runs as tests/hook_job.py does, with HOOK_JOB_ARGS.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hook_job  # noqa: E402  (sets the job's fresh Inductor cache dir before torch loads)

from autotune import cli  # noqa: E402
from autotune.inductor_glue import seams  # noqa: E402


def main() -> int:
    path, doctor_out, job_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    seam = next(seam for seam in seams.SEAMS if seam.path == path)
    delattr(seam.owner(), seam.name)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            cli.main(["doctor", "--json"])
            code = 0
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    Path(doctor_out).write_text(json.dumps({"exit_code": code, "report": json.loads(printed.getvalue())}))
    sys.argv = [str(Path(hook_job.__file__)), *job_args]
    return hook_job.main()


if __name__ == "__main__":
    sys.exit(main())
