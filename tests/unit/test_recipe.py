"""The serving recipes of docs/serving.md, as tests/recipe.py reads them: every step there, in order, its
variables set before use, valid bash, and the steps agreeing with each other (the container a step stops
is one a step started; live-check asks the port the server listens on). The one-GB10 recipe itself runs in
tests/image/test_image_e2e.py; these checks need no image."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipe import (
    AUDITING_PAGE,
    FAKE_COPY,
    FAKE_ENTRYPOINT,
    FAKE_FILES,
    PAGE,
    REPO,
    RecipeError,
    Step,
    container_names,
    fake_image_commands,
    podman_shim,
    recipe_steps,
    script,
    steps_by_name,
    stopped_names,
    substitute,
    undefined_uses,
)

GB10 = ["vars", "pull", "verify", "serve-reference", "record", "stop-reference", "serve", "check"]
GB10_TP2 = ["vars", "pull", "serve-rank1", "serve-rank0", "check", "stop-rank1", "nccl"]
AUDIT = ["vars", "copy", "provenance", "checkout", "verify", "scan", "sbom", "vsa"]
TEXT = PAGE.read_text()


def joined(step: Step) -> str:
    """The step's text with backslash-continued lines joined: one command a line."""
    return step.text.replace("\\\n", " ")


@pytest.mark.parametrize(
    ("page", "recipe", "expected"),
    [(PAGE, "gb10", GB10), (PAGE, "gb10-tp2", GB10_TP2), (AUDITING_PAGE, "audit", AUDIT)],
)
def test_every_step_is_there_in_order_with_its_variables_set(
    page: Path, recipe: str, expected: list[str]
) -> None:
    steps = recipe_steps(page.read_text(), recipe, page)
    steps_by_name(steps, expected, recipe, page)
    assert undefined_uses(steps, page) == []
    for step in steps:
        checked = subprocess.run(
            ["bash", "-n"],
            input=script(steps[0].text, step, page),
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, f"{page}:{step.line}: step {step.name}: {checked.stderr}"


def test_the_one_gb10_recipe_holds_together() -> None:
    """What the image test relies on and cannot tell apart from a wrong page by itself."""
    steps = steps_by_name(recipe_steps(TEXT, "gb10"), GB10, "gb10")
    assert "@sha256:" in steps["vars"].text, "the image is named by digest"
    for serve, stop in (("serve-reference", "stop-reference"), ("serve", "check")):
        names = container_names(steps[serve])
        assert len(names) == 1, f"{PAGE}:{steps[serve].line}: expected one --name, found {names}"
        stops = stopped_names(steps[stop]) if stop.startswith("stop") else []
        inspected = f"podman inspect --format '{{{{.State.Pid}}}}' {names[0]}"
        assert names == stops or inspected in steps[stop].text, (
            f"{PAGE}:{steps[stop].line}: step {stop}: expected to stop or inspect {names[0]}, the container "
            f"step {serve} starts"
        )
        assert '--port "$PORT"' in steps[serve].text
    for check in ("record", "check"):
        assert 'live-check "http://127.0.0.1:$PORT"' in steps[check].text
        assert "--network host" in steps[check].text
    check = joined(steps["check"])
    for needed in ("--pid host", "$GPUS", "--profile reference", '--teardown-pid "$pid"', "--against"):
        assert needed in check, f"{PAGE}:{steps['check'].line}: step check: expected {needed!r}"
    serve = joined(steps["serve"])
    for setting in (
        "--max-model-len 1048576",
        "--max-num-seqs 1",
        "--max-num-batched-tokens 4096",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        '"cudagraph_mode": "FULL_AND_PIECEWISE"',
        '"method": "dspark"',
        '"num_speculative_tokens": 5',
    ):
        assert setting in serve, f"{PAGE}:{steps['serve'].line}: step serve: expected {setting!r}"


def test_the_tp2_recipe_names_its_logs_and_ranks() -> None:
    steps = steps_by_name(recipe_steps(TEXT, "gb10-tp2"), GB10_TP2, "gb10-tp2")
    for rank in (0, 1):
        serve = joined(steps[f"serve-rank{rank}"])
        assert (
            f"--node-rank {rank}" in serve and "--nnodes 2" in serve and "--tensor-parallel-size 2" in serve
        )
        assert f"NCCL_DEBUG_FILE=/work/nccl/gb10-{rank}.%p.log" in serve
        assert ("--headless" in serve) == (rank == 1)
    assert "NCCL_DEBUG=INFO" in steps["vars"].text and "NCCL_DEBUG_SUBSYS=INIT,COLL" in steps["vars"].text
    check = joined(steps["check"])
    assert "--log /work/dspark-tp2.log" in check and "--require-module-check" in check
    assert steps["serve-rank0"].text.count('>>"$WORK/dspark-tp2.log"') == 2  # both ranks' output
    assert stopped_names(steps["stop-rank1"]) == container_names(steps["serve-rank1"]) == ["sparkseal-rank1"]


PLANTED = """# A page

```sh recipe=r step=vars
A=1   # a comment: $NOT_READ
B="$A/b"
```

Prose.

```sh recipe=r step=use
C=$A
echo "$B $C ${D:-x}" '$E' "$(printf '{{.Pid}}')" "$HOME"
```

```sh recipe=other step=vars
Z=1
```
"""


def test_a_variable_read_before_it_is_set_is_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    steps = recipe_steps(PLANTED, "r", page)
    assert [(s.name, s.line) for s in steps] == [("vars", 4), ("use", 11)]
    assert undefined_uses(steps, page) == [
        f"{page}:12: step use reads $D, which the vars step does not assign and the step does not assign "
        "above it"
    ]
    with pytest.raises(RecipeError, match=r"expected the steps \['vars', 'run'\] in this order, found"):
        steps_by_name(steps, ["vars", "run"], "r", page)


def test_a_broken_block_is_named_with_its_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    with pytest.raises(RecipeError, match=f"{page}:3: recipe r step vars: no closing fence"):
        recipe_steps("x\n\n```sh recipe=r step=vars\nA=1\n", "r", page)
    twice = "```sh recipe=r step=vars\nA=1\n```\n```sh recipe=r step=vars\nA=2\n```\n"
    with pytest.raises(RecipeError, match=f"{page}:4: recipe r: step vars a second time"):
        recipe_steps(twice, "r", page)


def test_substitution_changes_only_the_named_variables() -> None:
    steps = recipe_steps(PLANTED, "r")
    text = substitute(steps[0], {"A": "it's here"})
    assert text == "A='it'\"'\"'s here'  # substituted by the test\nB=\"$A/b\"\n"
    done = subprocess.run(["bash", "-c", text + 'echo "$B"'], capture_output=True, text=True, check=True)
    assert done.stdout == "it's here/b\n"
    with pytest.raises(RecipeError, match=r"the vars step assigns \['A', 'B'\]; expected also \['Q'\]"):
        substitute(steps[0], {"Q": "1"})


def test_the_page_recipe_takes_the_tests_values() -> None:
    """The variables the image test substitutes are all the page's, and a step then reads the test's."""
    steps = steps_by_name(recipe_steps(TEXT, "gb10"), GB10, "gb10")
    values = {"IMAGE": "localhost/x:1", "GPUS": "", "MODELS": "/m", "WORK": "/tmp/w dir", "PORT": "18000"}
    text = substitute(steps["vars"], values).replace('mkdir -p "$WORK"', "")
    shown = subprocess.run(
        ["bash", "-c", text + 'printf "%s|" "$IMAGE" "$GPUS" "$MODELS" "$WORK" "$PORT"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout == "localhost/x:1||/m|/tmp/w dir|18000|"


def test_the_fake_servers_image_is_made_from_the_checkouts_files(tmp_path: Path) -> None:
    run = ["podman", "--runtime", "runc", "run", "--network=none"]
    copy, commit = fake_image_commands(run, "localhost/base:1", "maker", "localhost/fake:1")
    assert copy[: len(run)] == run and "--rm" not in copy
    assert copy[len(run) : len(run) + 4] == ["--name", "maker", "-v", f"{REPO / 'tests'}:/src/tests:ro"]
    tail = [
        "--entrypoint",
        "/opt/venv/bin/python3",
        "localhost/base:1",
        "-c",
        FAKE_COPY,
        "/opt/sparkseal-fake",
    ]
    assert copy[len(run) + 4 : len(run) + 10] == tail
    assert copy[len(run) + 10 :] == list(FAKE_FILES)
    for path in FAKE_FILES:
        assert (REPO / path).is_file(), path
    # The copy itself, run here on a scratch root: every file lands under it, byte for byte.
    root = tmp_path / "fake"
    src = tmp_path / "src"
    for path in FAKE_FILES:
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes((REPO / path).read_bytes())
    code = FAKE_COPY.replace("'/src'", repr(str(src)))
    subprocess.run([sys.executable, "-c", code, str(root), *FAKE_FILES], check=True)
    assert all((root / path).read_bytes() == (REPO / path).read_bytes() for path in FAKE_FILES)
    assert commit == [
        "podman", "commit", "--quiet",
        "--change", 'ENTRYPOINT ["/opt/venv/bin/python3", "-m", "tests.servers.fake_vllm"]',
        "--change", "ENV PYTHONPATH=/opt/sparkseal-fake", "maker", "localhost/fake:1",
    ]  # fmt: skip
    assert FAKE_ENTRYPOINT[-1] == "tests.servers.fake_vllm"


def test_the_podman_shim_adds_this_hosts_options(tmp_path: Path) -> None:
    real = tmp_path / "real podman"
    real.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    real.chmod(0o755)
    shim = tmp_path / "podman"
    shim.write_text(podman_shim(str(real), ["--runtime", "runc"], ["--ulimit", "nofile=1024:1024"]))
    shim.chmod(0o755)

    def args(*given: str) -> list[str]:
        return subprocess.run([shim, *given], capture_output=True, text=True, check=True).stdout.splitlines()

    assert args("run", "--rm", "x y") == [
        "--runtime",
        "runc",
        "run",
        "--ulimit",
        "nofile=1024:1024",
        "--rm",
        "x y",
    ]
    assert args("stop", "-t", "120", "n") == ["--runtime", "runc", "stop", "-t", "120", "n"]
    assert shlex.join(args("inspect", "--format", "{{.State.Pid}}")).endswith("'{{.State.Pid}}'")
