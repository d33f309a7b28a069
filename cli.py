"""The `autotune` command line.

Thin on purpose: each command parses its options, calls one library function
and prints the outcome with rich. Options that several commands take are
declared once and shared as decorators (``_cache_option``, ``_json_option``,
``_signing_key_option``), as sqlite-utils shares its own. Every error leaves
through one path, ``Failure``: one line on stderr (`Error: ...`), never a
traceback. The exit status of every command follows one table, ``EXIT_STATUSES``
(docs/cli.md is generated from it): one code per cause, whichever command meets it.

Module-level imports stay light (no SQLAlchemy, torch or Ray): `autotune --help` and a
sweep's bad input answer before any of them would have loaded.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from autotune.cache import (
    ARTIFACT_KINDS,
    ArtifactInfo,
    CacheError,
    CacheUnavailable,
    CacheWriteRefused,
    ImportValidationError,
    ReadOnlyError,
    SchemaOutdated,
    TuningResult,
)
from autotune.cache.errors import MalformedRow
from autotune.cache.signing import KeyFileError
from autotune.cache.text import escape_control
from autotune.inductor_glue.modelfile import ModelFileError
from autotune.listing import (
    Column,
    artifact_summary,
    fit_widths,
    fmt_age,
    fmt_bytes,
    miss_summary,
    result_summary,
    short_device,
    short_key,
    status_label,
    winner_label,
)
from autotune.settings import ON_MISS, SEARCHES, Settings, SettingsError
from autotune.shapes import fmt_ms as _fmt_ms
from autotune.shapes import fmt_speedup as _fmt_speedup
from autotune.shapes import shape_summary
from autotune.sweep.log_file import LogUnavailable
from autotune.workers.errors import WorkerError

if TYPE_CHECKING:
    from autotune.cache import Store  # SQLAlchemy's import: only where a command opens the cache
    from autotune.sweep.report import SweepReport

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class ExitStatus:
    """A row of the exit-status contract: every command that meets ``cause`` exits ``code``."""

    code: int
    cause: str
    meaning: str


DONE = ExitStatus(0, "done", "The command did what it was asked.")
CLOSED_PIPE = ExitStatus(
    0, "closed pipe", "The reader of its output left early (`autotune cache ls | head -1`): the rest of the "
    "output is dropped, nothing is printed on stderr, and the command ends with the code it would have had "
    "had its output been read whole. Not a shell's 141: whether the output fitted in the pipe before the "
    "reader left is a race, and the code must not depend on it.")
WORK_FAILED = ExitStatus(
    1, "work failed", "Work was tried and some of it failed; what succeeded is kept: a sweep's requests that "
    "did not tune (the others are stored), an unexpected database error, or a cache lost in the middle of a "
    "sweep, `doctor` finding a feature this machine uses off.")
BAD_INPUT = ExitStatus(
    2, "bad input", "One line names the problem and the fix: a wrong option, model file, --mode or --device, a "
    "cache URL or database that cannot be used (down, an old schema), a key file, an import file, a hostile "
    "stored row (a listing lists the others). What can be told before any work is: a sweep's mistakes are "
    "answered before Ray, torch or the database start, and leave no cache file and no log.")
REFUSED_WRITE = ExitStatus(
    3, "refused write", "The cache refused a write: a read-only role, file or server, a store opened "
    "read-only, a full disk. A sweep tries a write before any work, so it says so first; what was written "
    "before stays. Use a role or file that may write, or free space, and run the same command again.")
EXIT_STATUSES = (DONE, CLOSED_PIPE, WORK_FAILED, BAD_INPUT, REFUSED_WRITE)

# The causes each command can meet, by its path under `autotune`; every pair is tested
# (tests/test_exit_codes.py) and listed in docs/cli.md. `run` exits with its script's status.
COMMAND_EXITS: dict[str, tuple[ExitStatus, ...]] = {
    "": (DONE, BAD_INPUT),
    "cache stats": (DONE, BAD_INPUT),
    "cache ls": (DONE, CLOSED_PIPE, BAD_INPUT),
    "cache show": (DONE, BAD_INPUT),
    "cache export": (DONE, CLOSED_PIPE, BAD_INPUT),
    "cache import": (DONE, BAD_INPUT, REFUSED_WRITE),
    "cache prune": (DONE, BAD_INPUT, REFUSED_WRITE),
    "cache upgrade": (DONE, BAD_INPUT),
    "sweep": (DONE, WORK_FAILED, BAD_INPUT, REFUSED_WRITE),
    "run": (BAD_INPUT,),
    "keys new": (DONE, BAD_INPUT),
    "keys show": (DONE, BAD_INPUT),
    "doctor": (DONE, WORK_FAILED, BAD_INPUT),
}
COMMAND_EXIT_NOTES = {"run": "else its script's own exit status"}
EXIT_FAILED = WORK_FAILED.code
EXIT_BAD_INPUT = BAD_INPUT.code
EXIT_REFUSED_WRITE = REFUSED_WRITE.code
# Errors that mean "what you pointed me at is not usable as given": their message names it and the fix.
_BAD_INPUT_ERRORS = (CacheUnavailable, SchemaOutdated, ImportValidationError, KeyFileError,
                     ModelFileError, WorkerError, SettingsError, LogUnavailable, MalformedRow)
_REFUSED_WRITE_ERRORS = (CacheWriteRefused, ReadOnlyError)


class Failure(click.ClickException):
    """How every command stops early: `Error: MESSAGE` on one line of stderr, and the exit status
    of its cause (EXIT_STATUSES): 2 bad input (the message names the problem and the fix), 3 a
    refused write, 1 work that failed."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        # The message may quote stored text (a row, a host name): escaped as every printed value is.
        super().__init__(escape_control(" ".join(line.strip() for line in message.strip().splitlines()
                                                 if line.strip())))
        self.exit_code = exit_code


def fail(message: str, exit_code: int = EXIT_BAD_INPUT) -> NoReturn:
    raise Failure(message, exit_code)


def _as_failure(error: Exception) -> Failure | None:
    """The one line an error of ours, or a usage error of click's, becomes (None: a bug)."""
    if isinstance(error, click.UsageError) and not isinstance(error, click.exceptions.NoArgsIsHelpError):
        where = error.ctx.command_path if error.ctx is not None else "autotune"
        return Failure(f"{error.format_message().rstrip('.')} (see `{where} --help`)")
    if isinstance(error, _BAD_INPUT_ERRORS):
        return Failure(str(error))
    if isinstance(error, _REFUSED_WRITE_ERRORS):
        return Failure(str(error), EXIT_REFUSED_WRITE)
    if isinstance(error, CacheError):  # the cache failed in the middle of the work
        return Failure(str(error), EXIT_FAILED)
    return None


def _drop_stdout() -> None:
    """The reader of stdout went away (`... | head`): what the command prints from now on goes
    nowhere, and it ends as it would have (CLOSED_PIPE). Python's own flush at exit then has
    nothing to fail on."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # not a descriptor (a test runner's buffer)
        pass


def _echo(text: str) -> None:
    """``click.echo`` to stdout, where a reader that left drops the rest (CLOSED_PIPE)."""
    try:
        click.echo(text)
    except BrokenPipeError:
        _drop_stdout()


def _flush_stdout() -> None:
    """Flush stdout before the interpreter does: its flush at exit reports a closed pipe as
    an ignored exception and exit status 120."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
    except (OSError, ValueError):  # closed already
        pass


class _Group(click.Group):
    """A group whose commands' errors leave as one line (``Failure``): click's usage errors,
    the cache's, bad model files, key files, settings, a Ray that cannot be reached."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        finally:  # click ends with SystemExit: stdout is flushed here, whatever the code
            _flush_stdout()

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            raise _as_failure(error) or error from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # printed past our own writers (which drop the rest and go on)
            _drop_stdout()
            raise SystemExit(CLOSED_PIPE.code) from None
        except Failure:
            raise
        except Exception as error:
            failure = _as_failure(error)
            if failure is None:
                raise
            raise failure from None


class _Duration(click.ParamType):
    """30d, 12h, 2w, 90m, 45s."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", str(value).lower())
        if not match:
            self.fail(f"{value!r} is not a duration like 30d, 12h, 2w, 90m or 45s", param, ctx)
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _version() -> str:
    # The one place the version is written (pyproject.toml reads it too); no metadata lookup,
    # which a source tree or a renamed distribution would miss.
    from autotune import __version__

    return __version__


class _Console(Console):
    """Prints text with its control characters escaped: names, keys and messages come from
    the database, where anyone who can write may have stored terminal escape sequences. A
    reader of stdout that leaves (`| head`) drops the rest of the output (CLOSED_PIPE) where
    rich's own handler would exit 1."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(escape_control(o) if isinstance(o, str) else o for o in objects), **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _drop_stdout()


def _out() -> Console:
    # Built per call so CliRunner's captured stdout is used; soft_wrap keeps one line per row.
    return _Console(highlight=False, soft_wrap=True)


def _err() -> Console:
    return _Console(stderr=True, highlight=False, soft_wrap=True)


def _exit_if_malformed(found: Any) -> None:
    """After a listing: one line for each stored row it left out (it failed validation), exit 2."""
    malformed: list[MalformedRow] = getattr(found, "malformed", [])
    for error in malformed:
        _err().print(f"Error: {escape(str(error))}")
    if malformed:
        raise SystemExit(EXIT_BAD_INPUT)


def _settings(ctx: click.Context, **flags: Any) -> Settings:
    """The settings: these flags, --cache wherever it was given, then AUTOTUNE_*."""
    return Settings.from_env(cache=(ctx.obj or {}).get("cache_url"), **flags)


def _open(ctx: click.Context, *, read_only: bool) -> Store:
    from autotune.cache import Store

    return Store(_settings(ctx).cache, read_only=read_only)


def _cache_option(func: Any) -> Any:
    """--cache, on a group and on each command (either position works); ``_settings`` reads it."""

    def remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        # The dict is shared with subcommand contexts, so the innermost --cache wins.
        obj = ctx.ensure_object(dict)
        if value:
            obj["cache_url"] = value

    return click.option(
        "--cache",
        "cache_url",
        metavar="URL",
        expose_value=False,
        callback=remember,
        help="Cache database: sqlite:///PATH, a file path or postgresql://USER@HOST/DB "
        "(default: $AUTOTUNE_CACHE, else ~/.cache/autotune/cache.db).",
    )(func)


def _json_option(func: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(func)


def _signing_key_option(what: str) -> Callable[[Any], Any]:
    """--signing-key PATH: the private key that signs what the command publishes (``what``)."""
    return click.option("--signing-key", metavar="PATH",
                        help=f"Sign and publish {what} with this private key [default: $AUTOTUNE_SIGNING_KEY].")


# ------------------------------------------------------------------ printing


def _print_listing(columns: list[Column], rows: list[list[str]]) -> None:
    """A header and a line per row, in columns cut to fit the terminal; whole into a pipe or a file.
    Each cell's control characters are escaped before the columns are fitted, so they line up."""
    out = _out()
    rows = [[escape_control(cell) for cell in row] for row in rows]
    widths = fit_widths(columns, rows, out.width if out.is_terminal else sys.maxsize)

    def line(cells: list[str]) -> str:
        parts = [c.cut(cell, w) for c, cell, w in zip(columns, cells, widths)]
        return "  ".join(p.rjust(w) if c.right else p.ljust(w) for c, p, w in zip(columns, parts, widths)).rstrip()

    out.print(f"[bold]{escape(line([c.header for c in columns]))}[/bold]")
    for row in rows:
        out.print(escape(line(row)))


# ---------------------------------------------------------------------- groups


def _exit_epilog() -> str:
    codes = ", ".join(f"{status.code} {status.cause}" for status in EXIT_STATUSES)
    return f"Exit status, the same for every command: {codes} (docs/cli.md#exit-status)."


@click.group(cls=_Group, name="autotune", epilog=_exit_epilog())
@click.version_option(_version(), "--version", prog_name="autotune")
def main() -> None:
    """Ahead-of-time max-autotune sweeps and a shared kernel cache for torch.compile.

    \b
    Example:
        autotune cache stats
        autotune --version
    """


@main.group(cls=_Group)
@_cache_option
@click.pass_context
def cache(ctx: click.Context) -> None:
    """Inspect and manage the shared kernel cache.

    The cache is chosen by --cache URL, else $AUTOTUNE_CACHE, else the SQLite
    file ~/.cache/autotune/cache.db.

    \b
    Example:
        autotune cache --cache postgresql://autotune@db/cache stats
        AUTOTUNE_CACHE=/shared/cache.db autotune cache ls --op mm
    """
    ctx.ensure_object(dict)


@cache.command()
@_cache_option
@_json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Show row counts, schema revision and size of the cache.

    Artifacts (compiled graphs and kernels) are counted by kind and by signer
    (the key fingerprint, as `autotune keys show` prints it).

    \b
    Example:
        autotune cache stats
        autotune cache stats --json | jq .requests
        autotune cache stats --json | jq .artifact_signers
    """
    data = _open(ctx, read_only=True).stats()
    if as_json:
        _echo(json.dumps(data, indent=2))
        return
    out = _out()
    for name, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        elif name.endswith("_bytes"):
            value = fmt_bytes(value)
        out.print(f"[bold]{name.replace('_', ' '):<18}[/bold] {escape(str(value))}")


@cache.command(name="ls")
@_cache_option
@click.option("--op", help="Only this op (mm, addmm, bmm, convolution, ...).")
@click.option("--device", help="Only devices whose name contains NAME (or of kind NAME).")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True, help="At most N rows; 0 for all.")
@click.option("--misses", is_flag=True, help="List logged cache misses instead of results.")
@click.option("--artifacts", is_flag=True, help="List compiled artifacts (newest first) instead of results.")
@click.option("--kind", type=click.Choice(ARTIFACT_KINDS), help="With --artifacts: only this kind.")
@click.option("--signer", metavar="FINGERPRINT",
              help="With --artifacts: only those signed by this key (`autotune keys show`), or 'unsigned'.")
@_json_option
@click.pass_context
def ls(ctx: click.Context, op: str | None, device: str | None, limit: int, misses: bool, artifacts: bool,
       kind: str | None, signer: str | None, as_json: bool) -> None:
    """List cached requests, one per line, with their winners.

    Columns: id, request, device, winner, winner time, speedup over ATen, status with the
    noise the winner was chosen under (the spread of its timed rounds, "ok ±4%"), marked where
    ATen was stored because the faster-looking candidate was within the noise or the host was
    busy ("ok ±40%, aten: within noise").
    With --artifacts: id, kind, key, size, signer, torch version, device, age.

    \b
    Example:
        autotune cache ls --op mm --device h100 --limit 20
        autotune cache ls --misses
        autotune cache ls --artifacts --kind fx_graph --signer 3f2a9c0d1e4b5a67
    """
    _check_ls_flags(op, misses, artifacts, kind, signer)
    store = _open(ctx, read_only=True)
    if artifacts:
        found = store.artifacts(kind=kind, device=device, signer=signer, limit=limit or None)
        _print_artifacts(found, as_json)
        _exit_if_malformed(found)
        return
    if misses:
        _print_misses(store, op, device, limit, as_json)
        return
    rows = store.list_results(op=op, device=device, limit=limit or None)
    if as_json:
        _echo(json.dumps([result_summary(i, r) for i, r in rows], indent=2))
        _exit_if_malformed(rows)
        return
    columns = [Column("id", right=True), Column("request", least=22), Column("device", least=10, cut=short_device),
               Column("winner", least=10), Column("time", right=True), Column("vs aten", right=True),
               Column("status")]
    _print_listing(columns, [
        [str(row_id), shape_summary(result.request), result.env.device_name, winner_label(result),
         _fmt_ms(result.winner.time_ms if result.winner else None), _fmt_speedup(result.speedup_over_aten),
         status_label(result)]
        for row_id, result in rows])
    if not rows:
        _err().print("No cached requests match.")
    _exit_if_malformed(rows)


def _check_ls_flags(op: str | None, misses: bool, artifacts: bool, kind: str | None, signer: str | None) -> None:
    if misses and artifacts:
        fail("give --misses or --artifacts, not both")
    if artifacts and op:
        fail("--op filters requests; with --artifacts use --kind, --signer or --device")
    if not artifacts and (kind or signer):
        fail("--kind and --signer filter artifacts: add --artifacts")


def _print_artifacts(found: list[ArtifactInfo], as_json: bool) -> None:
    if as_json:
        _echo(json.dumps([artifact_summary(a) for a in found], indent=2))
        return
    columns = [Column("id", right=True), Column("kind"), Column("key", least=16, cut=short_key),
               Column("size", right=True), Column("signer", least=8), Column("torch", least=8),
               Column("device", least=10, cut=short_device), Column("age", right=True)]
    _print_listing(columns, [
        [str(info.id), info.kind, short_key(info.key), fmt_bytes(info.size), info.signer or "unsigned", info.torch_version,
         info.device, fmt_age(info.created_at)]
        for info in found])
    if not found:
        _err().print("No cached artifacts match.")


def _print_misses(store: Store, op: str | None, device: str | None, limit: int, as_json: bool) -> None:
    needle = (device or "").lower()
    logged = store.misses()
    found = [
        m
        for m in logged
        if (not op or m.request.op == op)
        and (not needle or needle in m.env.device_name.lower() or needle == m.env.device_kind.lower())
    ]
    found = found[:limit] if limit else found
    if as_json:
        _echo(json.dumps([miss_summary(m) for m in found], indent=2))
        _exit_if_malformed(logged)
        return
    columns = [Column("count", right=True), Column("request", least=22), Column("device", least=10, cut=short_device),
               Column("last seen"), Column("host", least=8)]
    _print_listing(columns, [
        [str(miss.count), shape_summary(miss.request), miss.env.device_name, f"{miss.last_seen:%Y-%m-%d %H:%M:%S}",
         miss.host]
        for miss in found])
    if not found:
        _err().print("No logged misses match.")
    _exit_if_malformed(logged)


@cache.command()
@_cache_option
@click.argument("request_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the stored result as JSON.")
@click.pass_context
def show(ctx: click.Context, request_id: int, as_json: bool) -> None:
    """Show one cached request and every candidate, fastest first.

    ID is the number in the first column of `autotune cache ls`.

    \b
    Example:
        autotune cache show 42
    """
    result = _open(ctx, read_only=True).get(request_id)
    if result is None:
        fail(f"no cached request with id {request_id}; see `autotune cache ls`")
    if as_json:
        _echo(json.dumps({"id": request_id, **result.to_json()}, indent=2))
        return
    _print_result(request_id, result)


def _print_result(request_id: int, result: TuningResult) -> None:
    out, env, req, prov = _out(), result.env, result.request, result.provenance
    out.print(f"[bold]#{request_id}  {escape(shape_summary(req))}[/bold]  status {escape(result.status)}")
    details = [
        ("op", f"{req.op}   precision {req.precision}   key {req.key}"),
        ("inputs_key", req.inputs_key),
        ("params", json.dumps(req.params) if req.params else "-"),
        ("device", f"{env.device_kind} {env.device_name}"),
        ("versions", f"torch {env.torch_version}, triton {env.triton_version}, cuda {env.cuda_version}"),
        ("env key", env.key),
        ("tuned", f"{prov.created_at:%Y-%m-%d %H:%M:%S} UTC on {prov.host or '?'} "
                  f"(sweep {prov.sweep_id or '-'}, {prov.tuning_seconds or 0:.1f} s, {prov.source})"),
        ("validation", json.dumps(result.validation) if result.validation else "-"),
    ]
    if result.error:
        details.append(("error", result.error))
    for name, value in details:
        out.print(f"  {name:<11} {escape(str(value))}")
    aten = result.aten_time_ms
    ordered = sorted(result.candidates, key=lambda c: (c.time_ms is None, c.time_ms or 0.0))
    out.print(f"[bold]Candidates ({len(ordered)}, fastest first; * = winner)[/bold]")
    for cand in ordered:
        mark = "*" if cand.choice_hash == result.winner_hash else " "
        if cand.time_ms is not None:
            speed = _fmt_speedup(aten / cand.time_ms if aten and cand.time_ms > 0 else None)
            timing = f"{_fmt_ms(cand.time_ms):>11}  {speed:>7}"
        else:
            timing = f"{'FAILED':>11}  {cand.failure_kind or '':>7}"
        line = f"  {mark} {timing}  {cand.kind:<7} {cand.name} {cand.description}".rstrip()
        out.print(escape(line))
        if cand.failure_message:
            out.print(f"      [dim]{escape(cand.failure_message)}[/dim]")


@cache.command(name="export")
@_cache_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.pass_context
def export_(ctx: click.Context, file: str) -> None:
    """Write every cached result, kernel config and artifact to FILE as JSON Lines ('-' for stdout).

    The first line is a format header; each further line is one record.
    Artifacts keep their signatures, so the importing side can still verify them.

    \b
    Example:
        autotune cache export cache.jsonl
        autotune cache export - | gzip > cache.jsonl.gz
    """
    store = _open(ctx, read_only=True)
    # atomic: a failed export never leaves a truncated file behind.
    try:
        with click.open_file(file, "w", encoding="utf-8", atomic=file != "-") as fp:
            report = store.export_jsonl(fp)
            fp.flush()  # stdout is kept open: a closed pipe shows here, not at exit
    except BrokenPipeError:  # `export - | head`: the reader had enough (CLOSED_PIPE), no bad path
        _drop_stdout()
        return
    except OSError as error:
        fail(f"cannot write {file}: {error.strerror}; choose a writable path")
    configs = f", {report.kernel_configs} pointwise kernel configs" if report.kernel_configs else ""
    _err().print(f"Exported {report.results} results{configs} and {report.artifacts} artifacts "
                 f"to {escape('stdout' if file == '-' else file)}")


@cache.command(name="import")
@_cache_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.pass_context
def import_(ctx: click.Context, file: str) -> None:
    """Import results and artifacts from a JSON Lines FILE made by `export` ('-' for stdin).

    Every line is checked first; one bad line and nothing is imported.
    Importing the same file again changes nothing. Artifacts keep their
    signatures as exported (jobs verify them before loading) and never replace
    one already stored under the same key.

    \b
    Example:
        autotune cache import cache.jsonl
        gunzip -c cache.jsonl.gz | autotune cache --cache postgresql://db/cache import -
    """
    store = _open(ctx, read_only=False)
    try:
        with click.open_file(file, "r", encoding="utf-8") as fp:
            report = store.import_jsonl(fp)
    except ImportValidationError as error:
        fail(f"{file}: {error}; nothing was imported")
    except UnicodeDecodeError as error:
        fail(f"{file}: not text (byte {error.start} is not UTF-8), so not a file `autotune cache export` "
             "wrote; nothing was imported")
    except OSError as error:
        fail(f"cannot read {file}: {error.strerror}")
    configs = f", {report.kernel_configs} pointwise kernel configs" if report.kernel_configs else ""
    _out().print(f"Imported {report.imported} results ({report.unchanged} unchanged){configs} and "
                 f"{report.artifacts} artifacts ({report.artifacts_skipped} already stored) from {escape(file)}")


@cache.command()
@_cache_option
@click.option("--torch-version", metavar="V", help="Only results tuned / artifacts built with this torch version.")
@click.option("--device", metavar="NAME", help="Only devices whose name contains NAME (or of kind NAME).")
@click.option("--older-than", type=_Duration(), help="Only records written longer ago than this (30d, 12h, 2w).")
@click.option("--dry-run", is_flag=True, help="Only count what would be removed.")
@click.pass_context
def prune(
    ctx: click.Context,
    torch_version: str | None,
    device: str | None,
    older_than: timedelta | None,
    dry_run: bool,
) -> None:
    """Remove cached results and artifacts matching ALL the given filters.

    Logged misses matching the filters go too, and environments left empty.
    An artifact's device is matched as a case-insensitive substring.

    \b
    Example:
        autotune cache prune --torch-version 2.5.1 --dry-run
        autotune cache prune --device a100 --older-than 30d
    """
    if not (torch_version or device or older_than):
        fail("give at least one of --torch-version, --device or --older-than")
    store = _open(ctx, read_only=dry_run)
    filters: dict[str, Any] = {"torch_version": torch_version, "device": device, "older_than": older_than}
    # Artifacts first: prune() removes matching artifacts too, so counted after it they would read 0.
    artifacts = store.prune_artifacts(**filters, dry_run=dry_run)
    removed = store.prune(**filters, dry_run=dry_run)
    verb = "Would remove" if dry_run else "Removed"
    _out().print(f"{verb} {removed} cached requests and {artifacts} artifacts")


@cache.command()
@_cache_option
@click.pass_context
def upgrade(ctx: click.Context) -> None:
    """Create the cache schema, or migrate it to this autotune's version.

    Run it when a command says the schema is outdated. Safe to repeat.

    \b
    Example:
        autotune cache upgrade
        autotune cache --cache postgresql://autotune@db/cache upgrade
    """
    store = _open(ctx, read_only=False)
    before = store.current_revision()
    after = store.upgrade()
    if before == after:
        _out().print(f"Cache schema already at revision {after} ({escape(store.masked_url)})")
    else:
        _out().print(f"Cache schema upgraded from {before or 'empty'} to {after} ({escape(store.masked_url)})")


# ------------------------------------------------------------------ sweep / run


def _batch_sizes(value: str | None) -> tuple[int | None, ...]:
    if not value:
        return (None,)
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        fail(f"--batch-sizes {value!r} is not a comma-separated list of integers, e.g. 1,8,32")
    if not sizes or any(size < 1 for size in sizes):
        fail(f"--batch-sizes {value!r}: batch sizes must be positive integers")
    return sizes


@main.command()
@click.argument("models", nargs=-1, type=click.Path(dir_okay=False), metavar="[MODEL.py]...")
@click.option("--entry", default="example", show_default=True, help="Function in MODEL that returns (module, inputs).")
@_cache_option
@click.option("--mode", help="torch.compile mode to capture and tune with [default: max-autotune].")
@click.option("--inductor-config", multiple=True, metavar="KEY=VALUE", help="Inductor config override (repeatable).")
@click.option("--batch-sizes", metavar="N,N,...", help="Capture each of these batch sizes; with several, also the "
              "graph a job recompiles with a dynamic batch when its batch size changes (in this order).")
@click.option("--dynamic", is_flag=True, help="Capture with dynamic dimensions from the start, as a job compiling "
              "with dynamic=True (or torch._dynamo.mark_dynamic) asks: those MODEL names in DYNAMIC_DIMS, "
              "else dim 0 of every tensor input.")
@click.option("--train", is_flag=True, help="Also capture the backward graph (train mode, one backward pass); a "
              "model file that defines train_step() is captured so without it.")
@click.option("--ddp", is_flag=True, help="Compile as one rank of a DistributedDataParallel job does: Dynamo "
              "splits the graph at DDP's gradient buckets.")
@click.option("--bucket-cap-mb", type=float, help="With --ddp: the job's DDP bucket_cap_mb, at least 1 "
              "[default: DDP's, 25].")
@click.option("--fsdp", is_flag=True, help="Compile as one rank of an FSDP2 job does: fully_shard on each "
              "block of the model (each ModuleList entry, else each child with parameters), then the root.")
@click.option("--world-size", type=click.IntRange(min=2), help="With --ddp or --fsdp: the job's ranks "
              "[default: 2].")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), help="Target device [default: cuda if present].")
@click.option("--address", help="Join this Ray cluster instead of starting Ray locally.")
@click.option("--workers", type=click.IntRange(min=1), help="CPU actors [default: 1].")
@click.option("--gpus", type=click.IntRange(min=1), help="Use at most N GPUs [default: all].")
@click.option("--jobs-per-gpu", type=click.IntRange(min=1), help="Requests each GPU works on at once: one "
              "compiles its candidates while another times them; the timings take turns [default: 4].")
@click.option("--capture-processes", type=click.IntRange(min=1), help="Models captured at once, each in a "
              "process of its own [default: one per GPU; on a CPU, one model after another].")
@click.option("--passes-per-gpu", type=click.IntRange(min=1), help="End-to-end passes each GPU runs at once, "
              "a whole model each: one compiles while another times its kernels [default: 2].")
@click.option("--timeout", "request_timeout", type=float, help="Seconds one request may take [default: 600].")
@click.option("--search", type=click.Choice(SEARCHES), help="Inductor's search space for each GEMM/conv: "
              "exhaustive enumerates block sizes, stages and warps (GPU Triton templates; on a CPU it offers what "
              "default does) and retunes rows a default search stored [default: default].")
@click.option("--budget-s", type=float, help="With --search exhaustive: seconds of benchmarking per request; "
              "then the best so far wins [default: no limit but --timeout].")
@click.option("--force", is_flag=True, help="Capture anew (no stored capture replayed) and retune what the cache holds.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--misses", is_flag=True, help="Also tune every miss the hook logged for this machine.")
@_signing_key_option("the compiled artifacts of the end-to-end compile")
@click.option("--log", "log_path", metavar="PATH", type=click.Path(dir_okay=False),
              help="Write Inductor's, torch's, Ray's and the workers' output here [default: $AUTOTUNE_LOG, else a "
              "new file per sweep in logs/ beside the SQLite cache, or in ~/.cache/autotune/logs].")
@click.option("-v", "--verbose", is_flag=True, help="Also stream that log to the terminal as it is written.")
@_json_option
@click.pass_context
def sweep(ctx: click.Context, models: tuple[str, ...], entry: str, mode: str | None, inductor_config: tuple[str, ...],
          batch_sizes: str | None, dynamic: bool, train: bool, ddp: bool, bucket_cap_mb: float | None, fsdp: bool,
          world_size: int | None, device: str | None, address: str | None,
          workers: int | None, gpus: int | None, jobs_per_gpu: int | None, capture_processes: int | None,
          passes_per_gpu: int | None, request_timeout: float | None, search: str | None, budget_s: float | None,
          force: bool, dry_run: bool, misses: bool, signing_key: str | None,
          log_path: str | None, verbose: bool, as_json: bool) -> None:
    """Capture every GEMM/conv autotune request of each MODEL and tune the uncached ones on Ray.

    Several models make one queue: the union of their requests is tuned once. Sweeps
    sharing a cache database lease each request, so none is tuned twice.

    The terminal shows the sweep's phases and a summary; what Inductor, torch, Ray and
    the workers print goes to a log file, whose path the summary ends with (-v streams it).

    Exit status: 0 all well, 1 some requests failed (the good ones are stored), 2 bad input
    (a bad model file, --mode or --device, a cache that cannot be reached, no Ray, or a Ray
    cluster that cannot be joined; each answered in seconds, with no cache file or log left
    behind where it can be told before anything starts), 3 the cache refused a write.

    \b
    Example:
        autotune sweep examples/mlp.py
        autotune sweep examples/resnet.py examples/gpt.py --cache postgresql://tuner@db/kernels
        autotune sweep model.py --batch-sizes 1,8,32 --dry-run --json
        autotune sweep model.py --batch-sizes 64,128   # also what a job recompiles when its batch changes
        autotune sweep model.py --dynamic --batch-sizes 64   # jobs compiling with dynamic=True
        autotune sweep --misses
        autotune sweep model.py --signing-key ~/.autotune/sweeper   # also publish compiled artifacts
        autotune sweep model.py --train --ddp --bucket-cap-mb 1   # a torchrun job's DDP ranks
    """
    if not models and not misses:
        fail("give a MODEL.py to sweep, or --misses to tune the misses the hook logged")
    settings = _settings(ctx, mode=mode, device=device, address=address, workers=workers, gpus=gpus,
                         jobs_per_gpu=jobs_per_gpu, capture_processes=capture_processes,
                         passes_per_gpu=passes_per_gpu, request_timeout=request_timeout, signing_key=signing_key, log=log_path,
                         search=search, budget_s=budget_s)
    if budget_s is not None and settings.search != "exhaustive":
        fail("--budget-s applies to the exhaustive search only; add --search exhaustive, or drop --budget-s")
    _check_sweep_input(models, entry, inductor_config, settings)
    _check_keys(settings)
    from autotune.sweep.report import SweepOptions

    options = SweepOptions(models[0] if models else None, entry=entry, more_models=tuple(models[1:]),
                           batch_sizes=_batch_sizes(batch_sizes), dynamic=dynamic,
                           inductor_config=inductor_config, train=train, force=force, dry_run=dry_run,
                           misses=misses, distributed=_distributed(ddp, fsdp, bucket_cap_mb, world_size))
    # A cache that cannot be reached (2) or written (3) stops it before any work: _as_failure's line.
    report, log_file = _run_sweep(options, settings, verbose=verbose, quiet=as_json)
    from autotune.sweep.view import no_request_notes, print_summary

    notes = no_request_notes(report, train=train, mode=settings.mode)
    if as_json:
        _echo(json.dumps({**report.to_json(), "log": str(log_file), "notes": notes}, indent=2))
        _stdout_to_stderr_after_report()
    else:
        print_summary(report, _out(), log_file, notes)
    for line in report.malformed_rows:  # each skipped; the rest were tuned
        _err().print(f"Error: {escape(line)}")
    if report.store_error is not None:
        fail(f"{report.store_error}; the sweep stopped: a rerun tunes what is missing",
             _store_error_code(report.store_error))
    if report.malformed_rows:
        raise SystemExit(EXIT_BAD_INPUT)
    raise SystemExit(EXIT_FAILED if report.failed else DONE.code)


def _store_error_code(message: str) -> int:
    """A sweep's store error in the middle of the work arrives as the cache's one line (a worker
    stored the result; workers/actor.store_result): a refused write's line (CacheWriteRefused,
    ReadOnlyError) is REFUSED_WRITE, as the same write refused anywhere else; any other, WORK_FAILED."""
    refused = message.startswith("cannot write to cache database") or "was opened read-only" in message
    return EXIT_REFUSED_WRITE if refused else EXIT_FAILED


def _check_sweep_input(models: tuple[str, ...], entry: str, inductor_config: tuple[str, ...],
                       settings: Settings) -> None:
    """A sweep's mistakes, answered before Ray, torch, Inductor or the cache start, so that
    nothing is left behind (no cache file, no log): each model file as far as it can be read
    without importing it, --inductor-config's form, and a --device this host lacks. --mode and
    the other settings were checked as the settings were made."""
    from autotune.inductor_glue.modelfile import check_config_pairs, check_model_file

    for path in dict.fromkeys(models):
        check_model_file(path, entry)
    check_config_pairs(inductor_config)
    if settings.device == "cuda" and not (settings.address or os.environ.get("RAY_ADDRESS")):
        problem = _no_cuda_here()
        if problem is not None:
            fail(f"--device cuda (or AUTOTUNE_DEVICE=cuda): {problem}; pass --device cpu, or join a Ray "
                 "cluster with GPUs (--address), where capture runs on a GPU node")


def _no_cuda_here() -> str | None:
    """Why torch will find no CUDA GPU on this host, or None where it will. Sure answers are had
    without importing torch where they can be: a torch built without CUDA (or ROCm), or a host
    without NVIDIA's device files; torch itself is asked otherwise."""
    build = _torch_build()
    if build is not None and not build.get("cuda") and not build.get("hip"):
        return f"the installed torch ({build.get('__version__', '?')}) is built for CPUs only"
    if build is not None and build.get("cuda") and not _nvidia_device_files():
        return "this host has no NVIDIA GPU (no /dev/nvidia* device)"
    import torch

    return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA GPU on this host"


def _torch_build() -> dict[str, Any] | None:
    """torch/version.py's constants (__version__, cuda, hip) read without importing torch;
    None where torch or the file cannot be found, or has another shape."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")  # finds the package, imports nothing
        locations = list(spec.submodule_search_locations or []) if spec else []
        folder = locations[0] if locations else None
        tree = ast.parse(Path(folder, "version.py").read_bytes()) if folder else None
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body if tree else []:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found if "cuda" in found else None


def _nvidia_device_files() -> bool:
    """An NVIDIA driver's device files (or WSL's GPU device): CUDA finds no GPU without them."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/nvidiactl").exists() or Path("/dev/dxg").exists()


def _stdout_to_stderr_after_report() -> None:
    """With --json, stdout holds the report alone: what prints after it (an exit handler of a
    model file or a library, a Ray thread telling of a lost node) goes to stderr instead. A
    script reads stdout whole as one JSON document, and text after it broke that."""
    try:
        own = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a test runner's buffer: nothing else writes there
        return
    if own:
        sys.stdout.flush()
        os.dup2(2, 1)


def _distributed(ddp: bool, fsdp: bool, bucket_cap_mb: float | None, world_size: int | None) -> Any:
    """The job --ddp/--fsdp describe, or None; contradictions are one line each."""
    if ddp and fsdp:
        fail("--ddp and --fsdp describe two different jobs; give the one your job uses")
    if bucket_cap_mb is not None and not ddp:
        fail("--bucket-cap-mb is DDP's; add --ddp, or drop it")
    if bucket_cap_mb is not None and bucket_cap_mb < 1:
        fail(f"--bucket-cap-mb {bucket_cap_mb:g}: Dynamo's DDPOptimizer refuses a cap below DDP's first bucket "
             "(1 MB), as the job's compile would; give 1 or more")
    if world_size is not None and not (ddp or fsdp):
        fail("--world-size describes a distributed job; add --ddp or --fsdp, or drop it")
    if not (ddp or fsdp):
        return None
    from autotune.inductor_glue import seams
    from autotune.inductor_glue.distributed import DistributedSpec

    problem = seams.FAKE_STORE.problem()  # before Ray starts, not as the model's error in capture
    if problem is not None:
        fail(f"--ddp and --fsdp compile over torch's fake process group, which this torch lacks ({problem}); "
             "use torch 2.11 to 2.13")

    return DistributedSpec("ddp" if ddp else "fsdp", world_size or 2, bucket_cap_mb)


def _run_sweep(options: Any, settings: Settings, *, verbose: bool, quiet: bool) -> tuple[SweepReport, Path]:
    """Run the sweep with its libraries' output in its log file; the terminal shows its
    progress (not with --json: stderr is for errors then) and autotune's own warnings."""
    import logging

    from autotune.sweep import run_sweep
    from autotune.sweep.log_file import SweepLog, log_paths
    from autotune.sweep.view import SweepProgress, WarningsToConsole, append_requests

    autotune_log = logging.getLogger("autotune")
    with SweepLog(log_paths(settings.log, settings.cache)) as sweep_log:
        path = sweep_log.path
        settings = settings.replace(log=str(path))  # the actors and their children write there too
        console = Console(file=sweep_log.terminal_err, highlight=False, soft_wrap=True)
        warnings = WarningsToConsole(console)
        autotune_log.addHandler(warnings)
        progress = SweepProgress(console)
        if verbose:
            sweep_log.tail(progress.echo)
        try:
            report = run_sweep(options, settings, None if quiet else progress)
        finally:
            progress.stop()
            autotune_log.removeHandler(warnings)
    append_requests(report, path)
    return report, path


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@_cache_option
@click.option("--on-miss", type=click.Choice(ON_MISS), help="On a miss [default: tune].")
@click.option("--write-back/--no-write-back", default=None, help="Store the results of misses [default: on].")
@click.option("--read-only", is_flag=True, default=None, help="Never write to the cache.")
@_signing_key_option("what this job compiles anew")
@click.option("--trusted-key", "trusted_keys", multiple=True, metavar="PUB",
              help="Load artifacts signed by this public key (repeatable) [default: $AUTOTUNE_TRUSTED_KEYS].")
@click.pass_context
def run(ctx: click.Context, script: str, args: tuple[str, ...], on_miss: str | None, write_back: bool | None,
        read_only: bool | None, signing_key: str | None, trusted_keys: tuple[str, ...]) -> None:
    """Run SCRIPT like `python SCRIPT ARGS` with the warm-start hook installed.

    Options come from flags or AUTOTUNE_* variables. One line of hook stats goes to
    stderr at the end; the exit status is the script's. With --on-miss error, a miss
    stops the script with one line naming the request, and exit 2.

    \b
    Example:
        autotune run train.py --epochs 3
        AUTOTUNE_CACHE=postgresql://job@db/kernels autotune run --read-only serve.py
        AUTOTUNE_TRUSTED_KEYS=sweeper.pub autotune run train.py   # load signed artifacts
    """
    from autotune.job.hook_stats import CacheMissError
    from autotune.job.run_script import run_script

    settings = _settings(ctx, on_miss=on_miss, write_back=write_back, read_only=read_only or None,
                         signing_key=signing_key, trusted_keys=trusted_keys or None)
    _check_keys(settings)
    try:
        code, stats = run_script(script, list(args), settings)
    except CacheMissError as miss:  # raised out of torch's wrappers by run_script
        fail(str(miss).removeprefix("autotune: "))
    click.echo(f"autotune: {stats}", err=True)
    raise SystemExit(code)


def _check_keys(settings: Settings) -> None:
    """Load the key files the settings name now: a bad one is one line and exit 2, before any
    work (KeyFileError), without importing torch."""
    from autotune.settings import load_keys

    load_keys(settings)


# ------------------------------------------------------------------ keys


@main.group()
def keys() -> None:
    """Ed25519 key pairs that sign the artifact tier (compiled graphs and kernels).

    Writers (sweeps, and jobs that may publish) hold the private key:
    AUTOTUNE_SIGNING_KEY=PATH or --signing-key PATH. Readers list the public
    keys they trust: AUTOTUNE_TRUSTED_KEYS=PATH.pub[,PATH.pub...]. An artifact
    is loaded only when its signature verifies against a trusted key.
    """


@keys.command(name="new")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--comment", default="", help="A note stored in PATH.pub (e.g. who holds the key).")
@click.option("--force", is_flag=True, help="Overwrite PATH and PATH.pub if they exist.")
def keys_new(path: str, comment: str, force: bool) -> None:
    """Write a new private key to PATH (mode 0600) and its public key to PATH.pub.

    \b
    Example:
        autotune keys new ~/.autotune/sweeper
        AUTOTUNE_SIGNING_KEY=~/.autotune/sweeper autotune sweep model.py
        AUTOTUNE_TRUSTED_KEYS=~/.autotune/sweeper.pub python train.py
    """
    from autotune.cache.signing import generate

    signer = generate(path, comment=comment, overwrite=force)
    _out().print(f"Private key: {escape(path)} (mode 0600; keep it on the hosts that publish)")
    _out().print(f"Public key:  {escape(path)}.pub (fingerprint {signer.fingerprint}; "
                 "list it in AUTOTUNE_TRUSTED_KEYS on the hosts that load)")


@keys.command(name="show")
@click.argument("path", type=click.Path(dir_okay=False))
def keys_show(path: str) -> None:
    """Print the fingerprint of a private key or a PATH.pub public key (as `cache ls --artifacts` shows signers).

    \b
    Example:
        autotune keys show ~/.autotune/sweeper.pub
    """
    from autotune.cache.signing import fingerprint, load_public_key, load_signer

    public = load_public_key(path) if path.endswith(".pub") else load_signer(path).public_key
    _out().print(f"{fingerprint(public)}  ed25519 {public.hex()}")


# ------------------------------------------------------------------ doctor


@main.command()
@_cache_option
@_json_option
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Print torch, Triton, Python, the device, autotune's version and extras, the C++
    compiler and whether the cache answers, then each feature on or off, naming the torch
    attribute it misses; then a warning for each problem found (a torch not tested, a Triton
    other than torch's pin, a feature off). Exit 0 when every feature this machine uses is on,
    else 1; a warning alone leaves it 0.

    \b
    Example:
        autotune doctor --cache postgresql://job@db/kernels
        autotune doctor --json | jq '.features[] | select(.on | not)'
    """
    from autotune.doctor import diagnose, exit_code, leave, render

    report = diagnose(_settings(ctx).cache)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(render(report)))
    leave(exit_code(report))


if __name__ == "__main__":  # python -m autotune.cli, as the `autotune` script
    main()
