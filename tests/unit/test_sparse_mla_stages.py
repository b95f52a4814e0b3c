"""bench/sparse_mla_stages.py: its stage guards fit the kernel source as it is (no GPU needed).

The bench compiles the kernel with each stage of the main loop left out; if the kernel's text moves, the
guards must fail loudly rather than cut a statement in half, and this catches it before a GPU run does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sparse_mla_stages", REPO / "bench" / "sparse_mla_stages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guarded_body(text: str, stage: str) -> str:
    macro = f"SPARKSEAL_BENCH_SKIP_{stage.upper()}"
    assert text.count(f"#ifndef {macro}\n") == 1, stage
    return text.split(f"#ifndef {macro}\n", 1)[1].split("\n#endif\n", 1)[0]


def test_each_stage_guard_wraps_whole_statements_of_the_kernel() -> None:
    tool = _tool()
    assert set(tool.STAGES) == {"dequant", "load", "s", "pv", "combine"}
    assert tool.FILES == ["sparse_mla.cu", "sparse_mla_kernel.cuh", "sparse_mla_ws.cuh"]
    for name in tool.FILES:
        source = (tool.CSRC / name).read_text()
        stages = tool.stages_in(name)
        for stage in stages:
            body = _guarded_body(tool.guarded(source, stage, name), stage)
            assert body.strip(), stage
            for opening, closing in ("{}", "()", "[]"):
                assert body.count(opening) == body.count(closing), (stage, opening, body)
            assert body.rstrip().endswith((";", "}")), (stage, body)
        # All of a file's stages at once, as the bench applies them: the rest of the source is unchanged.
        stripped = tool.guarded_file(name, source)
        for stage in stages:
            opening = f"#ifndef SPARKSEAL_BENCH_SKIP_{stage.upper()}\n"
            assert stripped.count(opening) == 1, (name, stage)
            head, tail = stripped.split(opening)
            assert "\n#endif\n" in tail, (name, stage)
            stripped = head + tail.replace("\n#endif\n", "", 1)
        assert stripped == source


def test_a_stage_that_moved_is_named_with_the_file() -> None:
    tool = _tool()
    with pytest.raises(
        SystemExit,
        match=r"sparse_mla_kernel\.cuh: expected the stage 's' to start once at .*"
        r"found it 0 times; update STAGES",
    ):
        tool.guarded("__global__ void nothing() {}\n", "s")
    _, start, _ = tool.STAGES["pv"][0]
    with pytest.raises(
        SystemExit, match=r"expected the stage 'pv' to end at .* after its start; update STAGES"
    ):
        tool.guarded(f"{start}\n  // the rest of the loop is gone\n", "pv")


def test_a_missing_compiler_is_named_before_anything_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    tool = _tool()
    assert tool.main(["--nvcc", "/nonexistent/nvcc"]) == 1
    assert capsys.readouterr().err == (
        "bench/sparse_mla_stages.py: --nvcc /nonexistent/nvcc: expected the CUDA compiler (a program on PATH "
        "or its path), found none\n"
    )


def test_no_gpu_is_said_before_anything_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    tool = _tool()
    # Any program stands in for nvcc: the GPU check comes before the first build.
    assert tool.main(["--nvcc", "true", "--out", "/nonexistent/out.md"]) == 1
    assert capsys.readouterr().err == "bench/sparse_mla_stages.py: expected a CUDA GPU, torch sees none\n"
