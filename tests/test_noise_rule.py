"""The noise rule (workers/noise.py): a winner other than ATen only when it clearly beats
ATen; of equals, the same one every time. Pure functions: no database, device or Ray."""

from __future__ import annotations

import math

import pytest

from autotune.cache.records import FALLBACK_BUSY_HOST, FALLBACK_WITHIN_NOISE, CandidateResult
from autotune.workers.noise import (
    BUSY_FLOOR,
    NOISE_FLOOR,
    Timed,
    choose,
    choose_busy,
    choose_candidate,
    is_busy,
    runs_first,
    summarize,
)


def test_a_clear_winner_is_stored() -> None:
    rows = [Timed("aten", True, 1.0, 0.02), Timed("tpl", False, 0.5, 0.02), Timed("tpl2", False, 0.8, 0.02)]
    decision = choose(rows)
    assert decision is not None and (decision.winner, decision.fallback_reason) == ("tpl", None)


def test_a_winner_within_the_noise_of_aten_is_stored_as_aten() -> None:
    # 10% faster, but its rounds disagree by 20%: not a win.
    decision = choose([Timed("aten", True, 1.0, 0.05), Timed("tpl", False, 0.9, 0.2)])
    assert decision is not None and (decision.winner, decision.fallback_reason) == ("aten", FALLBACK_WITHIN_NOISE)
    assert decision.noise == 0.2


def test_equals_that_clearly_beat_aten_store_the_same_one_whichever_timed_luckier() -> None:
    # Both templates clearly beat ATen, but not each other: every sweep stores the same one.
    luck_a = [Timed("aten", True, 2.0, 0.01), Timed("b", False, 1.0, 0.05), Timed("a", False, 1.02, 0.05)]
    luck_b = [Timed("aten", True, 2.0, 0.01), Timed("b", False, 1.02, 0.05), Timed("a", False, 1.0, 0.05)]
    decisions = [choose(rows) for rows in (luck_a, luck_b)]
    assert [(d.winner, d.fallback_reason) for d in decisions if d is not None] == [("a", None), ("a", None)]


def test_the_graph_runs_the_equal_the_rule_stores_so_the_check_checks_it() -> None:
    # "b" timed luckier, "a" is stored: the tuning compile must run "a" (Inductor runs the fastest
    # time it is handed), or the numerical check after it checks a kernel that is never served.
    rows = [Timed("aten", True, 2.0, 0.01), Timed("b", False, 1.0, 0.05), Timed("a", False, 1.02, 0.05)]
    decision = choose_busy(rows, busy=False)
    assert decision is not None and decision.winner == "a"
    handed = runs_first({row.choice: row.median_ms for row in rows}, decision.winner)
    assert min(handed, key=handed.__getitem__) == "a" and handed["b"] == 1.0 and handed["aten"] == 2.0
    assert runs_first({"x": 1.0}, None) == {"x": 1.0}


def test_an_equal_that_does_not_clearly_beat_aten_is_not_stored() -> None:
    # "a" sorts first, but its rounds disagree too much to beat ATen: the fastest, a clear win, is kept.
    rows = [Timed("aten", True, 1.0, 0.01), Timed("b", False, 0.80, 0.1), Timed("a", False, 0.85, 0.2)]
    decision = choose(rows)
    assert decision is not None and (decision.winner, decision.fallback_reason) == ("b", None)


def test_the_floor_holds_where_the_rounds_agree_by_chance() -> None:
    tight = [Timed("aten", True, 1.0, 0.0), Timed("tpl", False, 1.0 / (1 + NOISE_FLOOR / 2), 0.0)]
    assert choose(tight).fallback_reason == FALLBACK_WITHIN_NOISE  # type: ignore[union-attr]
    unknown = [Timed("aten", True, 1.0, None), Timed("tpl", False, 0.5, None)]
    assert choose(unknown).winner == "tpl"  # type: ignore[union-attr]


def test_rounds_that_disagree_by_more_than_the_time_itself_store_aten() -> None:
    # 5000x faster by the medians, but one round of each took far longer than its median.
    rows = [Timed("aten", True, 40.0, 1.3), Timed("tpl", False, 0.008, 7000.0)]
    assert choose(rows).fallback_reason == FALLBACK_WITHIN_NOISE  # type: ignore[union-attr]


def test_aten_fastest_or_alone_and_no_aten_at_all() -> None:
    assert choose([Timed("aten", True, 1.0, 0.5), Timed("tpl", False, 1.1, 0.0)]).fallback_reason is None  # type: ignore[union-attr]
    # No ATen to fall back to: the fastest is stored.
    assert choose([Timed("a", False, 1.0, 0.5), Timed("b", False, 1.1, 0.5)]).winner == "a"  # type: ignore[union-attr]
    assert choose([Timed("aten", True, math.inf, None)]) is None
    assert choose([]) is None


def test_a_busy_host_needs_a_larger_margin_and_says_so() -> None:
    rows = [Timed("aten", True, 1.0, 0.05), Timed("tpl", False, 0.8, 0.05)]  # 25% faster
    assert choose_busy(rows, busy=False).winner == "tpl"  # type: ignore[union-attr]
    busy = choose_busy(rows, busy=True)
    assert busy is not None and (busy.winner, busy.fallback_reason) == ("aten", FALLBACK_BUSY_HOST)
    huge = [Timed("aten", True, 1.0, 0.05), Timed("tpl", False, 1.0 / (2 + BUSY_FLOOR), 0.05)]
    assert choose_busy(huge, busy=True).winner == "tpl"  # type: ignore[union-attr]
    # Within the noise on a quiet host too: the reason stays within_noise.
    close = [Timed("aten", True, 1.0, 0.05), Timed("tpl", False, 0.99, 0.05)]
    assert choose_busy(close, busy=True).fallback_reason == FALLBACK_WITHIN_NOISE  # type: ignore[union-attr]


def test_only_a_cpu_host_counts_as_busy() -> None:
    assert is_busy("cpu", 1.5) and not is_busy("cpu", 0.5) and not is_busy("cpu", None)
    assert not is_busy("cuda", 4.0)


def test_summarize_rounds() -> None:
    assert summarize([1.0, 1.2, 0.8]) == (1.0, pytest.approx(0.4), 3)
    assert summarize([2.0]) == (2.0, None, 1)
    assert summarize([math.inf, math.nan]) == (math.inf, None, 0)
    assert summarize([math.inf, 1.0, 3.0]) == (2.0, 1.0, 2)  # a failed round is left out


def test_choose_candidate_reads_a_results_candidates() -> None:
    cands = [CandidateResult("h1", "aten", "mm", time_ms=1.0, spread=0.01),
             CandidateResult("h2", "cpp", "gemm", time_ms=0.5, spread=0.01),
             CandidateResult("h3", "cpp", "gemm2", time_ms=None, failure_kind="compile_error")]
    assert choose_candidate(cands).winner == "h2"  # type: ignore[union-attr]
    assert choose_candidate(cands[2:]) is None
