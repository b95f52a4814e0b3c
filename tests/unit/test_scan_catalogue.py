"""The maintained rule catalogue (Kingfisher, hash-locked): each family we rely on, found and not over-found.

Samples are built at test time (tests/secret_samples.py); every run also checks that no output carries
a secret, only its redacted form.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.scan import scanner as scan
from sparkseal.scan.catalogue import Catalogue, CatalogueError
from tests.secret_samples import Family, families, pypi_prefix

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "third_party/scan/scanner.lock.json"


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return Catalogue.find()


@pytest.fixture(scope="module")
def samples(catalogue: Catalogue) -> dict[str, Family]:
    listed = subprocess.run(
        [str(catalogue.binary), "rules", "list", "--format=json", "--no-update-check"],
        capture_output=True,
        check=True,
    )
    patterns = {rule["id"]: rule["pattern"] for rule in json.loads(listed.stdout)}
    return families(pypi_prefix(patterns["betterleaks.pypi-upload-token"]))


@pytest.fixture(scope="module")
def sample_report(
    catalogue: Catalogue, samples: dict[str, Family], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, scan.Report]:
    root = tmp_path_factory.mktemp("samples")
    for name, family in samples.items():
        for kind in ("positive", "negative"):
            path = root / name / kind / family.filename
            path.parent.mkdir(parents=True)
            path.write_text(getattr(family, kind))
    return root, scan.run_scan([root], None, None, root=root, catalogue=catalogue)


def test_the_scanner_is_the_locked_one(catalogue: Catalogue) -> None:
    lock = json.loads(LOCK.read_text())["wheels"]["kingfisher-bin"]
    assert catalogue.version == lock["version"]
    assert len(catalogue.rules) > 400
    assert catalogue.describe() == {
        "name": "kingfisher",
        "rules": len(catalogue.rules),
        "version": lock["version"],
    }


# Every rule family we rely on; tests/secret_samples.py builds their samples.
FAMILIES = (
    "huggingface-user",
    "huggingface-org",
    "openai",
    "anthropic",
    "github",
    "gitlab",
    "slack",
    "aws",
    "gcp-service-account",
    "azure",
    "stripe",
    "npm",
    "pypi",
    "private-key",
    "jwt",
)


@pytest.mark.parametrize("family", FAMILIES)
def test_positive_sample_is_found_by_its_rule(
    family: str, samples: dict[str, Family], sample_report: tuple[Path, scan.Report]
) -> None:
    root, report = sample_report
    where = f"{root}/{family}/positive/{samples[family].filename}"
    hits = [f for f in report.findings if f.path == where]
    assert {f.rule for f in hits} & set(samples[family].rules), [f.location() for f in hits]
    for finding in hits:
        if finding.rule not in scan.RULES:  # the catalogue's, redacted to 4 characters and a length
            assert "***(" in finding.match and len(finding.match) < 24, finding.match


@pytest.mark.parametrize("family", FAMILIES)
def test_negative_sample_is_not_found(family: str, sample_report: tuple[Path, scan.Report]) -> None:
    root, report = sample_report
    negative = f"{root}/{family}/negative/"
    assert [
        f.location() for f in report.findings if f.path.startswith(negative) and f.rule not in scan.RULES
    ] == []


def test_the_cli_finds_a_hugging_face_token_in_env_and_py_and_never_prints_it(
    samples: dict[str, Family], tmp_path: Path
) -> None:
    token = samples["huggingface-user"].positive.split("=", 1)[1].strip()
    (tmp_path / ".env").write_text(f"HF_TOKEN={token}\n")
    (tmp_path / "app.py").write_text(f'\nHF_TOKEN = "{token}"\n')
    allow = tmp_path / "allow.json"
    allow.write_text(json.dumps({"allow": [{"path": "*/.env", "rule": "secret-file", "reason": "fixture"}]}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkseal",
            "scan",
            str(tmp_path / ".env"),
            str(tmp_path / "app.py"),
            "--allow",
            str(allow),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"{tmp_path}/.env:1:betterleaks.huggingface-access-token: {token[:4]}***(37 chars)",
        f"{tmp_path}/app.py:2:betterleaks.huggingface-access-token: {token[:4]}***(37 chars)",
    ]
    assert done.stdout.splitlines()[-1].endswith(
        f"(rules: {len(scan.RULES)} of sparkseal, {len(Catalogue.find().rules)} of kingfisher 2.14.0)"
    )
    assert token not in done.stdout + done.stderr


def test_the_allow_list_takes_catalogue_rule_ids_and_checks_them(
    catalogue: Catalogue, samples: dict[str, Family], tmp_path: Path
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/jwt.md").write_text(samples["jwt"].positive)
    allow = tmp_path / "allow.json"
    entry = {"path": "*/docs/*.md", "rule": "betterleaks.jwt", "reason": "the example token of the guide"}
    allow.write_text(json.dumps({"allow": [entry]}))
    report = scan.run_scan([tmp_path / "docs"], None, allow, root=tmp_path, catalogue=catalogue)
    assert (report.findings, [f.rule for f in report.allowed]) == ([], ["betterleaks.jwt"])

    # A glob covers a family of rules (the module manifest's digests beside vendor-named paths).
    (tmp_path / "docs/manifest.json").write_text(
        json.dumps({"sentry_sdk/api.py": "9942" + "ab12" * 15, "x": samples["github"].positive})
    )
    allow.write_text(json.dumps({"allow": [{**entry, "path": "*/docs/*", "rule": "betterleaks.*"}]}))
    report = scan.run_scan([tmp_path / "docs"], None, allow, root=tmp_path, catalogue=catalogue)
    assert report.findings == [] and {f.rule for f in report.allowed} >= {
        "betterleaks.jwt",
        "betterleaks.github-pat",
    }
    allow.write_text(json.dumps({"allow": [{**entry, "rule": "nosuch.*"}]}))
    with pytest.raises(scan.ScanInputError, match=re.escape("found 'nosuch.*'")):
        scan.run_scan([tmp_path / "docs"], None, allow, root=tmp_path, catalogue=catalogue)

    allow.write_text(json.dumps({"allow": [{**entry, "rule": "betterleaks.no-such-rule"}]}))
    with pytest.raises(scan.ScanInputError) as caught:
        scan.run_scan([tmp_path / "docs"], None, allow, root=tmp_path, catalogue=catalogue)
    assert str(caught.value).startswith(f"{allow}: allow[0]: expected a rule among generic-api-key, ")
    assert str(caught.value).endswith(
        f" or of the catalogue ({catalogue.binary} rules list), found 'betterleaks.no-such-rule'"
    )


def test_json_report_names_the_scanner(catalogue: Catalogue, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("nothing\n")
    report = scan.run_scan([tmp_path / "a.txt"], None, None, root=tmp_path, catalogue=catalogue)
    document = json.loads(scan.render(report, as_json=True))
    assert document["scanner"] == {"name": "kingfisher", "rules": len(catalogue.rules), "version": "2.14.0"}


def test_a_missing_or_broken_scanner_is_named(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError) as caught:
        Catalogue(tmp_path / "kingfisher")
    assert (
        str(caught.value)
        == f"{tmp_path / 'kingfisher'}: expected the kingfisher executable, found no executable file"
    )
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\necho 'something else 1.0'\n")
    fake.chmod(0o755)
    with pytest.raises(CatalogueError) as caught:
        _ = Catalogue(fake).version
    assert str(caught.value).startswith(
        f"{fake} --version: expected 'kingfisher VERSION', found b'something else 1.0"
    )


def test_no_installed_scanner_points_to_make_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """An auditor's set-up is `make tools` (`make setup` is the test machine's): the message names it."""
    monkeypatch.delenv("SPARKSEAL_SCANNER", raising=False)
    monkeypatch.setitem(sys.modules, "kingfisher", None)  # an import of it now fails
    with pytest.raises(CatalogueError) as caught:
        Catalogue.find()
    assert str(caught.value) == (
        "no secret scanner: expected the kingfisher-bin package (`make tools` installs it from "
        ".ci/requirements-trust.txt) or --scanner/SPARKSEAL_SCANNER naming the kingfisher binary, found none"
    )


def test_layer_members_are_scanned_by_the_catalogue_in_batches(
    catalogue: Catalogue, samples: dict[str, Family], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members go to the catalogue in bounded batches, each named by its path inside the layer."""
    from tests.unit.test_scan import _layer

    monkeypatch.setattr(scan, "_BATCH_BYTES", 64)
    files = {
        "opt/app/a/.env": samples["huggingface-user"].positive.encode(),
        "opt/app/b/.env": samples["huggingface-user"].positive.encode(),
        "../escape/key.py": samples["github"].positive.encode(),
        "opt/app/clean.py": b"print(1)\n" * 20,
    }
    files_seen, findings = scan.scan_layer_stream(io.BytesIO(_layer(files)), "sha256:layer", catalogue)
    assert files_seen == 4
    assert sorted((f.path, f.rule) for f in findings if f.rule.startswith("betterleaks.")) == [
        ("../escape/key.py", "betterleaks.github-pat"),
        ("opt/app/a/.env", "betterleaks.huggingface-access-token"),
        ("opt/app/b/.env", "betterleaks.huggingface-access-token"),
    ]
    assert all(f.layer == "sha256:layer" for f in findings)
