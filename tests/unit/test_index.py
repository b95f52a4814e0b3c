"""Index lookup against a loopback PEP 691 index, public or private (credentials in its URL or a netrc file).

URL resolution for Bazel: test_resolve.py; downloads: test_download.py.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from pathlib import Path

import pytest

from sparkseal.fetch import index as index_module
from sparkseal.fetch.index import FetchError, index_url, list_files, lookup, project_name
from tests.servers.fixture_index import LOGIN, FixtureIndex, with_credentials

SDIST = "pkg-1.0.tar.gz"
WHEEL = "pkg-1.0-py3-none-any.whl"
FILES = {SDIST: b"sdist bytes\n", WHEEL: b"wheel bytes\n", "other-2.0.tar.gz": b"other\n"}


@pytest.fixture
def pip_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Point pip's configuration at one file of the test's own; return a function that writes it."""
    from pip._internal import configuration

    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setattr(
        configuration, "get_configuration_files", lambda: {k: [] for k in ("global", "site", "user")}
    )
    path = tmp_path / "pip.conf"
    path.write_text("")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(path))
    return path.write_text


# --- project_name ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "project"),
    [
        ("vllm-0.25.1.tar.gz", "vllm"),
        ("vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl", "vllm"),
        ("python-dateutil-2.8.2.tar.gz", "python-dateutil"),
        ("python_dateutil-2.9.0.post0-py2.py3-none-any.whl", "python-dateutil"),
        ("Zope.Interface-5.0.zip", "zope-interface"),
        ("typing_extensions-4.12.2-py3-none-any.whl", "typing-extensions"),
        ("foo_bar-1.0-1-py3-none-any.whl", "foo-bar"),
        ("nvidia_cuda_runtime_cu12-12.4.127.tar.gz", "nvidia-cuda-runtime-cu12"),
    ],
)
def test_project_name(filename: str, project: str) -> None:
    assert project_name(filename) == project


@pytest.mark.parametrize(
    ("filename", "message"),
    [
        ("README.md", "README.md: not a wheel or sdist filename"),
        ("noversion.tar.gz", "noversion.tar.gz: not a wheel or sdist filename"),
        (
            "pkg-1.0.whl",
            "pkg-1.0.whl: not a wheel filename (expected NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl)",
        ),
    ],
)
def test_project_name_rejects(filename: str, message: str) -> None:
    with pytest.raises(FetchError) as caught:
        project_name(filename)
    assert str(caught.value).startswith(message)


# --- index_url ------------------------------------------------------------------------------------


def test_index_url_prefers_environment(pip_config, monkeypatch: pytest.MonkeyPatch) -> None:
    pip_config("[global]\nindex-url = http://configured.invalid/simple\n")
    monkeypatch.setenv("PIP_INDEX_URL", "http://from-env.invalid/simple")
    assert index_url() == "http://from-env.invalid/simple"


def test_index_url_reads_pip_global_config(pip_config, monkeypatch: pytest.MonkeyPatch) -> None:
    pip_config("[global]\nindex-url = http://configured.invalid/simple\n")
    monkeypatch.setenv("PIP_INDEX_URL", "")  # set but empty counts as unset
    assert index_url() == "http://configured.invalid/simple"


def test_index_url_install_section_overrides_global(pip_config) -> None:
    pip_config(
        "[global]\nindex-url = http://global.invalid/simple\n[install]\nindex-url = http://install.invalid/simple\n"
    )
    assert index_url() == "http://install.invalid/simple"


def test_index_url_falls_back_to_pips_default(pip_config, monkeypatch: pytest.MonkeyPatch) -> None:
    from pip._internal.models.index import PyPI

    monkeypatch.setattr(PyPI, "simple_url", "http://pips-default.invalid/simple")
    assert index_url() == "http://pips-default.invalid/simple"


def test_index_url_without_pip_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    for name in ("pip", "pip._internal", "pip._internal.configuration", "pip._internal.models.index"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(FetchError) as caught:
        index_url()
    assert str(caught.value).startswith("PIP_INDEX_URL is not set and pip cannot be imported (")
    assert str(caught.value).endswith("set PIP_INDEX_URL to the index URL")


def test_index_url_reports_broken_pip_config(pip_config) -> None:
    pip_config("this is not an ini file\n")
    with pytest.raises(FetchError, match=r"^cannot read pip's configuration: "):
        index_url()


# --- list_files / lookup --------------------------------------------------------------------------


@pytest.mark.parametrize("slash", ["", "/"])
def test_lookup_resolves_relative_url_and_hash(slash: str) -> None:
    with FixtureIndex(FILES) as idx:
        found = lookup(SDIST, idx.url + slash)
        assert found.url == idx.file_url(SDIST)
        assert found.sha256 == hashlib.sha256(FILES[SDIST]).hexdigest()
        assert found.page_url == idx.page_url("pkg")
        assert idx.requests == {"/simple/pkg/": 1}


def test_lookup_keeps_absolute_urls_and_normalises_the_project() -> None:
    files = {"Foo_Bar-1.0-py3-none-any.whl": b"x"}
    with FixtureIndex(files, absolute_urls=True) as idx:
        found = lookup("Foo_Bar-1.0-py3-none-any.whl", idx.url)
        assert found.url == idx.file_url("Foo_Bar-1.0-py3-none-any.whl")
        assert idx.requests == {"/simple/foo-bar/": 1}


def test_lookup_without_listed_hash() -> None:
    with FixtureIndex(FILES, listed_sha256_override={WHEEL: None}) as idx:
        assert lookup(WHEEL, idx.url).sha256 is None


def test_lookup_uses_the_configured_index(monkeypatch: pytest.MonkeyPatch) -> None:
    with FixtureIndex(FILES) as idx:
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        assert lookup(WHEEL).url == idx.file_url(WHEEL)


def test_list_files_lists_only_the_project() -> None:
    with FixtureIndex(FILES) as idx:
        page = list_files("pkg", idx.url)
    assert page.url == idx.page_url("pkg")
    assert sorted(f.filename for f in page.files) == sorted([SDIST, WHEEL])


def test_lookup_file_not_listed() -> None:
    with FixtureIndex(FILES, unlisted={SDIST}) as idx:
        with pytest.raises(FetchError) as caught:
            lookup(SDIST, idx.url)
        assert str(caught.value) == f"{SDIST} is not listed by the index {idx.page_url('pkg')}"


def test_lookup_project_not_found() -> None:
    with FixtureIndex(FILES) as idx:
        with pytest.raises(FetchError) as caught:
            lookup("nope-1.0.tar.gz", idx.url)
        page = idx.page_url("nope")
        assert str(caught.value) == f"nope-1.0.tar.gz: project page {page} not found on the index (HTTP 404)"


def test_lookup_index_unreachable() -> None:
    with FixtureIndex(FILES) as idx:
        url = idx.url
    with pytest.raises(FetchError) as caught:
        lookup(SDIST, url)
    assert str(caught.value).startswith(f"{SDIST}: index unreachable: {url}/pkg/: ")


def test_lookup_index_answers_html() -> None:
    with FixtureIndex(FILES, json_pages=False) as idx:
        with pytest.raises(FetchError) as caught:
            lookup(SDIST, idx.url)
        assert str(caught.value) == (
            f"{SDIST}: index page {idx.page_url('pkg')} answered with content type 'text/html', "
            "expected 'application/vnd.pypi.simple.v1+json'"
        )


def test_lookup_rejects_file_urls(tmp_path: Path) -> None:
    with pytest.raises(FetchError) as caught:
        lookup(SDIST, tmp_path.as_uri())
    assert str(caught.value) == (
        f"{SDIST}: index URL {tmp_path.as_uri()}/pkg/: scheme 'file' is not supported "
        "(expected http or https)"
    )


def test_parse_page_rejects_other_api_versions() -> None:
    with pytest.raises(FetchError) as caught:
        index_module._parse_page(
            b'{"meta": {"api-version": "2.0"}, "files": []}', "http://x.invalid/simple/p/"
        )
    assert (
        str(caught.value)
        == "index page http://x.invalid/simple/p/ speaks simple API version 2, expected version 1"
    )


def test_parse_page_rejects_non_pep691_json() -> None:
    with pytest.raises(FetchError, match=r"^index page http://x.invalid/p/ is not a PEP 691 project page: "):
        index_module._parse_page(b"[1, 2]", "http://x.invalid/p/")


# --- a private index -----------------------------------------------------------------------------


def test_index_without_credentials_names_the_index(no_netrc: None, password: str) -> None:
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx, pytest.raises(FetchError) as caught:
        list_files("pkg", idx.url)
    assert str(caught.value) == (
        f"index answered HTTP 401 Unauthorized for {idx.url}/pkg/: the index needs credentials; give them "
        "in the index URL (https://USER:PASSWORD@127.0.0.1/...) or in a netrc entry for 127.0.0.1 "
        "(NETRC or ~/.netrc)"
    )


def test_index_with_a_wrong_password_fails_without_printing_it(no_netrc: None, password: str) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx, pytest.raises(FetchError) as caught:
        lookup(SDIST, with_credentials(idx.url, LOGIN, wrong))
    message = str(caught.value)
    assert message == (
        f"{SDIST}: index answered HTTP 401 Unauthorized for http://***@{idx.url.split('://')[1]}/pkg/: "
        "the credentials sent were refused (check the password for 127.0.0.1)"
    )
    assert wrong not in message and password not in message and LOGIN not in message


def test_index_url_with_credentials_and_a_port_is_not_a_crash(no_netrc: None) -> None:
    with FixtureIndex(FILES) as idx:
        url = idx.url
    with pytest.raises(FetchError) as caught:
        list_files("pkg", with_credentials(url, "user", "secret"))
    message = str(caught.value)
    assert message.startswith(f"index unreachable: http://***@{url.split('://')[1]}/pkg/: ")
    assert "secret" not in message and "user" not in message


def test_a_port_that_is_not_a_number_is_a_clear_error(no_netrc: None) -> None:
    with pytest.raises(FetchError) as caught:
        list_files("pkg", "http://user:secret@index.internal:port/simple")
    assert str(caught.value) == "index URL http://***@index.internal:port/simple: its port is not a number"
