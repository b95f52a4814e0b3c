"""The test-only kernel variants apply to today's sources (tests/kernel_variant.py): the race the GPU
stress must catch is really built, and an edit that no longer matches is refused, not skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import kernel_variant
from tests.kernel_variant import EARLY_RELEASE, Edit, EditError


def test_early_release_moves_the_consumers_empty_arrive_before_their_read(tmp_path: Path) -> None:
    src = kernel_variant.edited_copy(tmp_path / "csrc", EARLY_RELEASE)
    text = (src / "sparse_mla_ws.cuh").read_text()
    original = (kernel_variant.CSRC / "sparse_mla_ws.cuh").read_text()
    consumer = text[text.index("// ---- Consumers ----") :]
    arrive = consumer.index("named_barrier_arrive(Cfg::kBarEmpty + b, Cfg::kThreads);")
    attend = consumer.index("tm.attend(k_tiles + b * NT * Cfg::kKStride")
    assert arrive < attend, "the broken variant must release K tile b before the consumers read it"
    original_consumer = original[original.index("// ---- Consumers ----") :]
    assert original_consumer.index("tm.attend(k_tiles + b * NT * Cfg::kKStride") < original_consumer.index(
        "named_barrier_arrive(Cfg::kBarEmpty + b, Cfg::kThreads);"
    ), "the product's kernel releases K tile b only after reading it"
    # Only that file changes, and by the two lines swapped.
    for path in kernel_variant.CSRC.iterdir():
        if path.name != "sparse_mla_ws.cuh":
            assert (src / path.name).read_bytes() == path.read_bytes(), path.name
    assert sorted(text.splitlines()) == sorted(original.splitlines())


def test_an_edit_that_no_longer_matches_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "a.cuh").write_text("one\ntwo\n")
    (src / "b.cuh").write_text("x\nx\n")
    edits = (Edit("a.cuh", "one\n", "ONE\n"), Edit("b.cuh", "x\n", "y\n"))
    with pytest.raises(EditError) as info:
        kernel_variant.apply_edits(src, edits)
    assert str(info.value) == (
        f"{src / 'b.cuh'}: expected the text to replace exactly once, found it 2 times: 'x\\n'"
    )
    assert (src / "a.cuh").read_text() == "one\ntwo\n", "no file may be written when an edit fails"
    with pytest.raises(EditError, match="found it 0 times"):
        kernel_variant.apply_edits(src, (Edit("a.cuh", "three\n", "3\n"),))
