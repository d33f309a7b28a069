"""What ``autotune sweep`` shows at its terminal (the CLI's; the sweep reports through
``sweep_report.Progress`` and returns a ``SweepReport``, and prints nothing itself).

While it runs: its phases (start-up, each model's capture, the tuning with an estimate of
the time left, the end-to-end pass of each model), live on a terminal and cleared at the
end. At the end: a table with a row per model,
the totals, the candidates that could not be timed counted by reason, the end-to-end
pass, and where the log is. Every request's own row goes to the log (and ``--json``).

Every value it prints passes through ``_text`` (``cache.text.escape_control``): a request
planned from the misses table (``--misses``) or a device name is stored text, which anyone
who can write the cache may have filled with terminal escape sequences.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune.cache.records import STATUS_OK, TuningResult
from autotune.cache.text import escape_control
from autotune.shapes import fmt_ms, fmt_speedup, shape_summary

from .cost import cost_line
from .report import STATUS_CACHED, Outcome, SweepReport

log = logging.getLogger(__name__)

# Modes in which Inductor autotunes GEMMs and convolutions (torch._inductor.list_mode_options).
_AUTOTUNING_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
FAILED_LISTED = 5  # failed requests named in the summary; the log and --json have them all
_SETTLED = (STATUS_CACHED, STATUS_OK, "planned", "elsewhere", "not_run")


class SweepProgress:
    """``sweep_report.Progress`` on a console: a live display on a terminal, cleared at the end;
    nothing on a file or a pipe (a job's log gets the summary, and the phases are in the log)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.live = console.is_terminal
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _counts_column(),
                            TimeElapsedColumn(), console=console, transient=True)
        self.task: Any = None
        self.failed = 0

    def stage(self, message: str) -> None:
        self._show(message, None)

    def start(self, total: int, description: str) -> None:
        self.failed = 0
        self._show(description, total)

    def advance(self, done: Outcome | str) -> None:
        if isinstance(done, Outcome) and done.status not in _SETTLED:
            self.failed += 1
        if self.task is not None:
            self.bar.update(self.task, advance=1, failed=f"{self.failed} failed" if self.failed else "")

    def _show(self, description: str, total: int | None) -> None:
        log.info(description)  # the log file's record of the phases
        if not self.live:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(_markup(description), total=total, failed="")
        else:
            self.bar.reset(self.task, total=total, description=_markup(description), failed="")

    def echo(self, line: str) -> None:
        """A line of the log (``-v``), above the live display."""
        self.console.print(_text(line), soft_wrap=True, highlight=False)

    def stop(self) -> None:
        if self.task is not None:
            self.bar.stop()
            self.task = None


def _counts_column() -> Any:
    """"3/40, 1 failed, ~0:04:10 left" for a phase of known length; nothing for the others."""
    from rich.progress import ProgressColumn, Task

    class Counts(ProgressColumn):
        def render(self, task: Task) -> Text:
            if task.total is None:
                return Text("")
            parts = [f"{task.completed:.0f}/{task.total:.0f}"]
            if task.fields.get("failed"):
                parts.append(task.fields["failed"])
            if task.time_remaining is not None and task.completed:
                minutes, seconds = divmod(int(task.time_remaining), 60)
                parts.append(f"~{minutes // 60}:{minutes % 60:02d}:{seconds:02d} left")
            return Text(", ".join(parts))

    return Counts()


class WarningsToConsole(logging.Handler):
    """autotune's own warnings, one line each, on the console (above a live display); one
    said again (a lease's heartbeat every few seconds) is in the log only."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console
        self.said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        lines = record.getMessage().strip().splitlines()
        line = f"{record.levelname.lower()}: {lines[0] if lines else ''}"
        if line not in self.said:
            self.said.add(line)
            self.console.print(_text(line), soft_wrap=True, highlight=False)


def _text(text: str) -> Text:
    """Text to print as it is (no markup), its control characters escaped."""
    return Text(escape_control(text))


def _markup(text: str) -> str:
    """Text for a place that reads rich's markup, shown as it is, its control characters escaped."""
    return escape(escape_control(text))


# ------------------------------------------------------------------ the summary


def print_summary(report: SweepReport, console: Console, log_path: Path | None, notes: list[str] | None = None) -> None:
    """The end of a sweep on the terminal: a screenful at most, whatever the request count;
    ``notes`` (``no_request_notes``) after the counts."""
    if report.dry_run:
        console.print(request_table(report))
    else:
        console.print(_model_table(report))
    for line in summary_lines(report) + list(notes or ()):
        console.print(_text(line), soft_wrap=True, highlight=False)
    if log_path is not None:
        console.print(_text(f"log: {log_path}"), soft_wrap=True, highlight=False)


def no_request_notes(report: SweepReport, *, train: bool, mode: str) -> list[str]:
    """Why a sweep found no request at all, and what to change: a sweep that says only
    "0 found" leaves a user to guess (``train``: --train was given)."""
    if report.found:
        return []
    if not report.models:  # --misses alone
        return ["note: nothing to tune: the hook logged no miss from a machine like this one that the cache "
                "does not answer (`autotune cache ls --misses` lists every logged miss)"]
    if mode not in _AUTOTUNING_MODES:
        return [f"note: 0 requests because --mode {mode} does not autotune GEMMs or convolutions; sweep with "
                "max-autotune (the default), the mode the jobs reading the cache compile with"]
    if report.device != "cpu":
        return ["note: 0 requests: the compiled graphs hold no matmul or convolution that Inductor autotunes; "
                "check that the model file's example() returns the model and the inputs a real call gets"]
    if train:
        return ["note: 0 requests because on a CPU Inductor autotunes a Linear or a convolution only in a frozen "
                "inference graph (torch._inductor.config.freezing = True), and a training step (--train, or a "
                "file with train_step()) is never frozen: each GEMM has one choice, ATen's. Sweep the training "
                "job where it runs, on GPUs (--device cuda, or --address a cluster with GPUs); on a CPU, sweep "
                "the inference graph (no --train) with freezing on"]
    return ["note: 0 requests because on a CPU Inductor autotunes a Linear or a convolution only with "
            "torch._inductor.config.freezing = True (set it in the model file, or pass --inductor-config "
            "freezing=True) in an inference graph (no --train, no train_step()): without it each GEMM has one "
            "choice, ATen's. A model with no matmul or convolution has nothing to tune either"]


def summary_lines(report: SweepReport) -> list[str]:
    device = report.env.device_name if report.env else report.device
    verb = "planned" if report.dry_run else "tuned"
    done = report.count("planned") if report.dry_run else report.tuned
    elsewhere = f", {report.elsewhere} tuned by another sweep" if report.elsewhere else ""
    lines = [f"requests: {report.found} found, {report.cached} cached, {done} {verb}{elsewhere}, "
             f"{report.failed} failed in {report.wall_seconds:.1f} s (capture {report.capture_seconds:.1f} s) "
             f"on {device}"]
    if len(report.models) > 1:
        per_model = ", ".join(f"{Path(m.path).name} {m.requests}" for m in report.models)
        lines.append(f"models: {per_model}: {report.captured} requests, {report.found} after de-duplication")
    reused = [m for m in report.models if m.reused_from]
    if reused:
        which = "" if len(report.models) == 1 else " of " + ", ".join(Path(m.path).name for m in reused)
        lines.append(f"capture{which} reused from {min(m.reused_from or '' for m in reused)} (--force captures anew)")
    refused = report.refused()
    if refused:
        reasons = ", ".join(f"{count} {reason.replace('_', ' ')}" for reason, count in refused.items())
        lines.append(f"candidates not timed: {sum(refused.values())} ({reasons}); each is recorded with its reason")
    lines += [line for line in (cost_line(report), report.busy_line()) if line]
    lines += _failed_lines(report)
    if report.store_error is not None:
        lines.append(f"stored {report.stored}, not stored {report.not_stored}, not run {report.not_run}: "
                     "the sweep stopped at the first result the cache refused")
    if report.pointwise is not None:
        lines += _pass_lines(report.pointwise)
    return lines


def _failed_lines(report: SweepReport) -> list[str]:
    failed = [o for o in report.outcomes if o.status not in _SETTLED]
    lines = [f"{o.status}: {shape_summary(o.request)}: {_first_line(o.result.error if o.result else '')}"
             for o in failed[:FAILED_LISTED]]
    if len(failed) > FAILED_LISTED:
        lines.append(f"... and {len(failed) - FAILED_LISTED} more failed: see the log, or --json")
    return lines


def _pass_lines(pointwise: Any) -> list[str]:
    failed = f"; failed: {_first_line(pointwise.error)}" if pointwise.error else ""
    if getattr(pointwise, "failed", None):  # each failed pass against its model
        failed = "; failed: " + ", ".join(f"{Path(f['model']).name} ({_first_line(f['error'])})"
                                          for f in pointwise.failed)
    if getattr(pointwise, "requeued", 0):
        failed += f"; {pointwise.requeued} killed pass(es) run again"
    if getattr(pointwise, "skipped", None):
        failed += f"; {len(pointwise.skipped)} model(s) with nothing new left out"
    artifacts = (f", {pointwise.artifacts_published} signed artifacts published"
                 if pointwise.artifacts_published else "")
    refused = (f" (Dynamo could not package the model: {pointwise.packages_refused})"
               if pointwise.packages_refused else "")
    decided = pointwise.fusion_verdicts_saved + pointwise.pad_decisions_saved
    verdicts = (f", {pointwise.fusion_verdicts_saved} fusion and {pointwise.pad_decisions_saved} padding verdicts"
                if decided else "")
    lines = [f"end-to-end compile: {pointwise.saved} pointwise/reduction configs{verdicts} stored"
             f"{artifacts}{refused} in {pointwise.seconds:.1f} s{failed}"]
    if pointwise.verdicts:
        lines.append(verdict_line(pointwise.verdicts))
    if pointwise.gemm_misses:  # the end-to-end check: a real compile of the model missed
        lines.append(f"warning: compiling the model with the new cache still missed {pointwise.gemm_misses} "
                     "GEMM/conv request(s); see `autotune cache ls --misses`")
    return lines


def verdict_line(verdicts: list[dict[str, Any]]) -> str:
    changed = [v for v in verdicts if v.get("changed")]
    line = f"timed in the graph: {len(verdicts)} GEMM/conv request(s), {len(changed)} winner(s) changed"
    return line + "".join(f"; {v['request']}: {v['winner_before']} -> {v['winner_after']}" for v in changed)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:160] if lines else "-"


def _model_table(report: SweepReport) -> Table:
    device = report.env.device_name if report.env else report.device
    table = Table(title=_markup(f"sweep {report.sweep_id} on {device}"))
    for column in ("model", "requests", "cached", "tuned", "failed", "vs ATen"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model, outcomes in _by_model(report):
        tuned = [o for o in outcomes if o.status == STATUS_OK]
        table.add_row(_text(model), str(len(outcomes)), str(sum(o.status == STATUS_CACHED for o in outcomes)),
                      str(len(tuned)), str(sum(o.status not in _SETTLED for o in outcomes)),
                      fmt_speedup(_mean_speedup(o.result for o in tuned)))
    return table


def _by_model(report: SweepReport) -> list[tuple[str, list[Outcome]]]:
    """Each model's requests (the first model that found a request has it), in capture order;
    the hook's logged misses (--misses) last."""
    names = {m.path: Path(m.path).name for m in report.models}
    groups: dict[str, list[Outcome]] = {name: [] for name in names.values()}
    for outcome in report.outcomes:
        groups.setdefault(names.get(outcome.model or "", "(logged misses)"), []).append(outcome)
    return list(groups.items())


def _mean_speedup(results: Iterable[TuningResult | None]) -> float | None:
    """The geometric mean of the winners' speedups over ATen."""
    speedups = [r.speedup_over_aten for r in results if r is not None and r.speedup_over_aten]
    if not speedups:
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def request_table(report: SweepReport) -> Table:
    """Every request, its winner and status: a dry run's plan, and the log's record of a sweep."""
    device = report.env.device_name if report.env else report.device
    table = Table(title=_markup(f"sweep {report.sweep_id} on {device}"))
    for column in ("request", "winner", "time", "vs ATen", "status"):
        table.add_column(column, justify="right" if column in ("time", "vs ATen") else "left")
    for outcome in report.outcomes:
        result = outcome.result
        winner = result.winner if result else None
        table.add_row(_text(shape_summary(outcome.request)), _winner_config(outcome),
                      fmt_ms(winner.time_ms if winner else None),
                      fmt_speedup(result.speedup_over_aten if result else None),
                      _text(outcome.status if outcome.stored else f"{outcome.status}, not stored"))
    return table


def _winner_config(outcome: Outcome) -> Text:
    winner = outcome.result.winner if outcome.result else None
    if winner is None:
        return _text("" if outcome.result is None else (outcome.result.error or "")[:60])
    keys = ("tile_shape", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
    shown = ", ".join(f"{k}={winner.params[k]}" for k in keys if k in winner.params)
    return _text(f"{winner.name} {shown}".strip())


def append_requests(report: SweepReport, path: Path) -> None:
    """Every request's row, at the end of the sweep's log: nothing the summary leaves out is lost."""
    try:
        with open(path, "a", encoding="utf-8") as log_file:
            console = Console(file=log_file, width=200, no_color=True, highlight=False, soft_wrap=True)
            console.print(request_table(report))
            for line in summary_lines(report):
                console.print(_text(line))
            # The errors the terminal shows after the summary, in the log too: a failed sweep's log says why.
            for line in report.malformed_rows + ([report.store_error] if report.store_error else []):
                console.print(_text(f"Error: {line}"))
    except OSError:
        logging.getLogger(__name__).debug("could not append the requests to %s", path, exc_info=True)
