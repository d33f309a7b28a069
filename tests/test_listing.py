"""The cache listings' pure parts (autotune/listing.py): widths that fit a terminal, cut cells."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from autotune.listing import Column, fit_widths, fmt_age, fmt_bytes, short_device, short_key


def test_columns_are_cut_from_the_one_with_most_to_spare_and_never_below_their_least() -> None:
    columns = [Column("id", right=True), Column("request", least=10), Column("device", least=6)]
    rows = [["1", "mm 4096x4096 @ 4096x4096 fp16", "NVIDIA H200"]]
    assert fit_widths(columns, rows, 1000) == [2, 29, 11]
    assert fit_widths(columns, rows, 30) == [2, 14, 10]  # 2 + 14 + 10 and two gaps of 2
    assert fit_widths(columns, rows, 5) == [2, 10, 6]  # as far as they go; the terminal wraps the rest


def test_a_cut_key_keeps_both_ends_and_a_device_drops_its_vendor_first() -> None:
    key = "a" * 30 + "MIDDLE" + "z" * 30
    cut = short_key(key, 21)
    assert len(cut) == 21 and cut.startswith("a" * 10) and cut.endswith("z" * 10)
    assert short_key("short") == "short"
    assert short_device("NVIDIA H100 80GB HBM3", 16) == "H100 80GB HBM3"
    assert short_device("NVIDIA H100 80GB HBM3", 8) == "H100 80…"


def test_sizes_and_ages_read_at_a_glance() -> None:
    assert [fmt_bytes(v) for v in (None, 999, 1500, 2_500_000, 7 * 10**12)] == ["-", "999 B", "1.5 kB", "2.5 MB",
                                                                                  "7000.0 GB"]
    now = datetime.now(timezone.utc)
    assert [fmt_age(now - timedelta(seconds=s)) for s in (5, 120, 7200, 3 * 86400)] == ["5s", "2m", "2h", "3d"]
