"""Download one locked file: repository cache first, then explicit URLs, then the pip index.

Python only turns a filename into a URL (``sparkseal.fetch.resolve``, PEP 691 JSON API of the index that
pip is configured with); Bazel's downloader fetches and verifies it, so users get the content-addressed
repository cache, ``--distdir`` and mirror rewriting, and a wrong hash never lands in the cache.
"""

# A URL that can never be fetched. Asking Bazel for it together with the locked sha256 returns the file
# from the repository cache when the cache holds it, and fails fast otherwise: so a fully cached build
# needs no network at all and skips the index lookup.
_CACHE_PROBE_URL = "file:///nonexistent/sparkseal-repository-cache-probe/"

INDEX_ENVIRON = ["PIP_INDEX_URL", "PIP_CONFIG_FILE"]

def workspace_root(rctx):
    """The directory of the main workspace, which holds the `sparkseal` Python package."""
    return rctx.path(Label("@//:WORKSPACE")).dirname

def host_python(rctx):
    """The host Python 3 that runs repository-rule helpers."""
    python = rctx.which("python3")
    if python == None:
        fail("sparkseal: no python3 on PATH; repository rules need the host Python 3 to query the index")
    return python

def run_python_helper(rctx, module, args):
    """Run `python3 -m <module> <args>` from the workspace's `sparkseal` package; return the result."""
    return rctx.execute(
        [host_python(rctx), "-m", module] + args,
        environment = {"PYTHONPATH": str(workspace_root(rctx))},
        quiet = True,
    )

def _resolve_url(rctx, filename, sha256):
    result = run_python_helper(rctx, "sparkseal.fetch.resolve", ["--sha256", sha256, filename])
    if result.return_code != 0:
        message = result.stderr.strip() or result.stdout.strip()
        fail("%s\n(while fetching @%s)" % (message, rctx.name))
    return result.stdout.strip()

def from_repository_cache(rctx, filename, sha256, output, urls = []):
    """Try `urls`, then the repository cache alone; return whether `output` now holds the locked file."""
    tried = list(urls) + [_CACHE_PROBE_URL + sha256 + "/" + filename]
    return rctx.download(tried, output, sha256 = sha256, allow_fail = True).success

def download_locked_file(rctx, filename, sha256, output, urls = []):
    """Fetch `filename` with the locked `sha256` into `output` (a path relative to the repository).

    Fails with a message naming the artifact, the expected and the actual sha256 on a mismatch; Bazel
    removes the half-made repository on failure, and nothing unverified reaches the repository cache.
    """
    if len(sha256) != 64:
        fail("sparkseal: %s: locked sha256 %r is not 64 hex digits" % (filename, sha256))
    if from_repository_cache(rctx, filename, sha256, output, urls):
        return
    rctx.report_progress("looking up %s in the package index" % filename)
    url = _resolve_url(rctx, filename, sha256)
    rctx.report_progress("downloading %s" % filename)
    if rctx.download([url], output, sha256 = sha256, allow_fail = True).success:
        return

    # The verified download failed: tell a mismatch from an outage. Bazel will not fetch the same URL
    # again in this fetch, so a small helper downloads it to scratch space to name the actual sha256.
    probe = run_python_helper(rctx, "sparkseal.fetch.actual_sha256", [filename, url])
    if probe.return_code == 0:
        fail("sparkseal: %s: sha256 mismatch: expected %s (locked), actual %s (downloaded from %s)" % (
            filename,
            sha256,
            probe.stdout.strip(),
            url,
        ))
    fail("sparkseal: %s: download from %s failed: %s" % (filename, url, probe.stderr.strip()))
