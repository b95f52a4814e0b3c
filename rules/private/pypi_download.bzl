"""Download one locked file: repository cache first, then explicit URLs, then the pip index.

Python only turns a filename into a URL (``sparkseal.fetch.resolve``, PEP 691 JSON API of the index that
pip is configured with); Bazel's downloader fetches and verifies it, so users get the content-addressed
repository cache, ``--distdir`` and mirror rewriting, and a wrong hash never lands in the cache.
"""

load(":helpers.bzl", "HELPER_SOURCES")

# NETRC names the netrc file that holds index credentials (else ~/.netrc): a change re-runs the lookup.
INDEX_ENVIRON = ["PIP_INDEX_URL", "PIP_CONFIG_FILE", "NETRC"]

def host_python(rctx):
    """The host Python 3 that runs repository-rule helpers."""
    python = rctx.which("python3")
    if python == None:
        fail("sparkseal: no python3 on PATH; repository rules need the host Python 3 to query the index")
    return python

def run_python_helper(rctx, module, args):
    """Run `python3 -m <module> <args>` with only the module's declared sources; return the result.

    Each source (HELPER_SOURCES) is read through its label, so Bazel re-runs the calling repository rule
    when one changes; the helper sees no other file of the checkout.
    """
    if module not in HELPER_SOURCES:
        fail("sparkseal: %s is not a declared repository-rule helper (rules/private/helpers.bzl)" % module)
    root = "_helpers/" + module
    for source in HELPER_SOURCES[module]:
        package, _, name = source.rpartition("/")
        if not rctx.path("%s/%s" % (root, source)).exists:
            rctx.symlink(rctx.path(Label("@//%s:%s" % (package, name))), "%s/%s" % (root, source))
    return rctx.execute(
        [host_python(rctx), "-m", module] + args,
        environment = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(rctx.path(root))},
        quiet = True,
    )

def _resolve_url(rctx, filename, sha256):
    """The file's URL (never with credentials) and the `auth` dict Bazel's download sends with it."""
    result = run_python_helper(rctx, "sparkseal.fetch.resolve", ["--bazel-auth", "--sha256", sha256, filename])
    if result.return_code != 0:
        # stderr only: stdout would hold the credentials of a successful answer.
        fail("%s\n(while fetching @%s)" % (result.stderr.strip(), rctx.name))
    answer = json.decode(result.stdout)
    return answer["url"], answer["auth"]

def from_repository_cache(rctx, filename, sha256, output, urls = []):
    """Try the repository cache alone, then `urls`; return whether `output` now holds the locked file.

    A download with no URL is answered from Bazel's repository cache or fails without trying anything:
    a fully cached build needs no network and skips the index lookup, and a cache miss prints nothing
    (a URL that cannot be fetched would print a `Download ... failed` warning per file). Failures of real
    URLs stay loud.
    """
    if rctx.download([], output, sha256 = sha256, allow_fail = True).success:
        return True
    return len(urls) > 0 and rctx.download(urls, output, sha256 = sha256, allow_fail = True).success

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
    url, auth = _resolve_url(rctx, filename, sha256)
    rctx.report_progress("downloading %s" % filename)
    if rctx.download([url], output, sha256 = sha256, allow_fail = True, auth = auth).success:
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
