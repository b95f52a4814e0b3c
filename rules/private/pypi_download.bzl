"""Download one locked file: repository cache first, then explicit URLs, then the pip index.

Python only turns a filename into a URL (``sparkseal.fetch.resolve``, PEP 691 JSON API of the index that
pip is configured with); Bazel's downloader fetches and verifies it, so users get the content-addressed
repository cache, ``--distdir`` and mirror rewriting, and a wrong hash never lands in the cache.
"""

load(":common.bzl", "apparent_repo_name")
load(":helpers.bzl", "HELPER_SOURCES")
load(":locks.bzl", "check_sha256")

# NETRC names the netrc file that holds index credentials (else ~/.netrc): a change re-runs the lookup.
INDEX_ENVIRON = ["PIP_INDEX_URL", "PIP_CONFIG_FILE", "NETRC", "SPARKSEAL_REPOSITORY_CACHE"]

# The repository cache of .bazelrc (`--repository_cache=~/.cache/sparkseal/repository`); a build that
# passes another `--repository_cache` names the same folder in SPARKSEAL_REPOSITORY_CACHE (`--repo_env`).
REPOSITORY_CACHE_ENV = "SPARKSEAL_REPOSITORY_CACHE"
_DEFAULT_REPOSITORY_CACHE = ".cache/sparkseal/repository"

def host_python(rctx):
    """The host Python 3 that runs repository-rule helpers."""
    python = rctx.which("python3")
    if python == None:
        fail("sparkseal: no python3 on PATH; repository rules need the host Python 3 to query the index")
    return python

def prepare_python_helper(rctx, module):
    """Link the declared sources of `module` into the repository; return the directory that holds them.

    Each source (HELPER_SOURCES) is read through its label, so Bazel re-runs the calling repository rule
    when one changes; the helper sees no other file of the checkout. Bazel restarts the rule from its
    first line when it reads a label it has not seen yet: a rule that prepares a helper before a download
    keeps those restarts from repeating the download.
    """
    if module not in HELPER_SOURCES:
        fail("sparkseal: %s is not a declared repository-rule helper (rules/private/helpers.bzl)" % module)
    root = "_helpers/" + module
    for source in HELPER_SOURCES[module]:
        package, _, name = source.rpartition("/")
        if not rctx.path("%s/%s" % (root, source)).exists:
            rctx.symlink(rctx.path(Label("@//%s:%s" % (package, name))), "%s/%s" % (root, source))
    return rctx.path(root)

def run_python_helper(rctx, module, args):
    """Run `python3 -m <module> <args>` with only the module's declared sources; return the result."""
    root = prepare_python_helper(rctx, module)
    return rctx.execute(
        [host_python(rctx), "-m", module] + args,
        environment = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(root)},
        quiet = True,
    )

def _resolve_url(rctx, filename, sha256):
    """The file's URL (never with credentials) and the `auth` dict Bazel's download sends with it."""
    result = run_python_helper(rctx, "sparkseal.fetch.resolve", ["--bazel-auth", "--sha256", sha256, filename])
    if result.return_code != 0:
        # stderr only: stdout would hold the credentials of a successful answer.
        fail("%s\n(while fetching @%s)" % (result.stderr.strip(), apparent_repo_name(rctx.name)))
    answer = json.decode(result.stdout)
    return answer["url"], answer["auth"]

def repository_cache_dir(rctx):
    """The repository cache folder: $SPARKSEAL_REPOSITORY_CACHE (a leading `~/` is $HOME), else .bazelrc's."""
    home = rctx.os.environ.get("HOME", "")
    value = rctx.os.environ.get(REPOSITORY_CACHE_ENV, "").strip()
    if not value:
        return home + "/" + _DEFAULT_REPOSITORY_CACHE
    if value.startswith("~/"):
        return home + value[1:]
    return value

def _copy_from_repository_cache(rctx, sha256, output):
    """Copy the cache's file of `sha256` into `output`, verified (sparkseal.fetch.cache_copy).

    With `--experimental_repository_cache_hardlinks` (.bazelrc) a cache hit is a hard link, which the
    kernel refuses across mount points (a cache bind-mounted or on a CI volume, the output base
    elsewhere): Bazel then treats the hit as a miss and would go to the network. The file is copied
    instead, by a helper that checks the copy's sha256: not through Bazel's downloader, since a `file://`
    URL is a download too, which `--repository_disable_download` refuses (Bazel 7.7.1). So every hit is
    served, offline included: a hard link where one can be made, a copy where it cannot.
    """
    cached = rctx.path("%s/content_addressable/sha256/%s/file" % (repository_cache_dir(rctx), sha256))
    if not cached.exists:
        return False
    result = run_python_helper(rctx, "sparkseal.fetch.cache_copy", [sha256, str(cached), str(rctx.path(output))])
    if result.return_code != 0:
        fail("%s\n(while fetching @%s)" % (result.stderr.strip(), apparent_repo_name(rctx.name)))
    return True

def from_repository_cache(rctx, filename, sha256, output, urls = []):
    """Try the repository cache alone, then `urls`; return whether `output` now holds the locked file.

    A download with no URL is answered from Bazel's repository cache or fails without trying anything:
    a fully cached build needs no network and skips the index lookup, and a cache miss prints nothing
    (a URL that cannot be fetched would print a `Download ... failed` warning per file). A hit Bazel could
    not hard-link is copied (_copy_from_repository_cache). Failures of real URLs stay loud.
    """
    if rctx.download([], output, sha256 = sha256, allow_fail = True).success:
        return True
    if _copy_from_repository_cache(rctx, sha256, output):
        return True
    return len(urls) > 0 and rctx.download(urls, output, sha256 = sha256, allow_fail = True).success

def downloads_disabled(rctx):
    """Whether Bazel refuses every download (`--repository_disable_download`).

    Bazel tells a repository rule neither the flag nor why a download failed; a `file://` download of a
    file the rule has just written fails only when downloads are refused. Asked on a failure path only,
    so that its message names the real cause instead of the network.
    """
    rctx.file("_probe/empty", "")
    refused = not rctx.download(["file://" + str(rctx.path("_probe/empty"))], "_probe/copy", allow_fail = True).success
    rctx.delete("_probe")
    return refused

def offline_miss_message(rctx, subjects, locked):
    """The message for locked files that are in no repository cache while Bazel may not download.

    `subjects` are (name, sha256) pairs; `locked` says where the sha256s are locked.
    """
    return "\n".join([
        "sparkseal: Bazel may not download (--repository_disable_download) and the repository cache at %s holds no file" % repository_cache_dir(rctx),
        "with the locked sha256 of:",
    ] + ["  %s: expected sha256 %s (%s)" % (name, sha256, locked) for name, sha256 in subjects] + [
        "Fill that cache from a build that may download, or name the cache that holds them with",
        "--repository_cache=DIR --repo_env=%s=DIR." % REPOSITORY_CACHE_ENV,
    ])

def prepare_download_verified(rctx):
    """Link download_verified's helper in now, before the network work that comes before the download.

    Bazel restarts a repository rule from its first line for each helper source it has not seen yet;
    a caller that looks a URL up (the index) first calls this, so the restarts repeat no lookup.
    """
    prepare_python_helper(rctx, "sparkseal.fetch.actual_sha256")

def download_verified(rctx, filename, urls, output, sha256, auth, subject = None, locked = "locked"):
    """Let Bazel download `urls` (tried in order) into `output`, verified against `sha256`; on failure,
    say why and fail.

    Bazel's download result says only `success`, so a second client (sparkseal.fetch.actual_sha256,
    Python's urllib) fetches each URL to scratch space and names the digest it got:

    - Bazel may not download at all (`--repository_disable_download`): that is the cause, whatever the
      URLs serve (offline_miss_message);
    - another digest: the file at that URL is not the locked one ("sha256 mismatch", both digests);
    - the locked digest: the file is fine and Bazel's own transfer failed (a proxy, TLS, a cut transfer,
      which Bazel 4.2.3 reports as "Checksum was ... but wanted ..."). That is printed, and Bazel
      downloads once more without `allow_fail`: a transient failure then heals, a lasting one ends the
      fetch with Bazel's own error (with `allow_fail`, the rule sees only `success = False`);
    - no digest from any URL: none can be fetched; the message names every URL with the helper's cause.

    `urls` (a list, or one URL) must carry no credentials (they travel in `auth`): they are printed, by
    us and by Bazel. `subject` names the file in messages (default `filename`); `locked` says where the
    sha256 is locked. Bazel removes the half-made repository on failure, and nothing unverified reaches
    the repository cache.
    """
    if type(urls) == "string":
        urls = [urls]

    # Before the download: linking the helper after it would restart the rule and download again.
    prepare_download_verified(rctx)
    if rctx.download(urls, output, sha256 = sha256, allow_fail = True, auth = auth).success:
        return
    subject = subject or filename
    if downloads_disabled(rctx):
        fail(offline_miss_message(rctx, [(subject, sha256)], locked))
    causes = []
    fine = None
    for url in urls:
        probe = run_python_helper(rctx, "sparkseal.fetch.actual_sha256", [filename, url])
        if probe.return_code != 0:
            causes.append((url, probe.stderr.strip()))
            continue
        actual = probe.stdout.strip()
        if actual != sha256:
            fail("sparkseal: %s: sha256 mismatch: expected %s (%s), actual %s (downloaded from %s)" % (
                subject,
                sha256,
                locked,
                actual,
                url,
            ))
        fine = fine or url
    if fine == None:
        if len(urls) == 1:
            fail("sparkseal: %s: download from %s failed (expected sha256 %s, %s): %s" % (
                subject,
                urls[0],
                sha256,
                locked,
                causes[0][1],
            ))
        fail("sparkseal: %s: download from %s failed (expected sha256 %s, %s):\n  %s" % (
            subject,
            " and from ".join(urls),
            sha256,
            locked,
            "\n  ".join(["%s: %s" % cause for cause in causes]),
        ))

    print(" ".join([
        "sparkseal: %s: Bazel's downloader failed to fetch %s," % (subject, fine),
        "but a second client (Python's urllib) fetched it with the locked sha256 %s," % sha256,
        "so the file is fine and the failure is Bazel's download (e.g. a proxy, TLS, or a",
        "partial/interrupted transfer, which Bazel reports as a checksum mismatch).",
        "Downloading once more with Bazel; if that fails too, Bazel's own error follows.",
    ]))
    rctx.download([fine], output, sha256 = sha256, auth = auth)

def download_locked_file(rctx, filename, sha256, output, urls = []):
    """Fetch `filename` with the locked `sha256` into `output` (a path relative to the repository).

    A failed download fails naming the artifact and the cause (download_verified): a mismatch with the
    expected and the actual sha256, or a failure of Bazel's downloader with Bazel's own error.
    """
    check_sha256(sha256, filename, "sha256")
    if from_repository_cache(rctx, filename, sha256, output, urls):
        return
    if downloads_disabled(rctx):
        fail(offline_miss_message(rctx, [(filename, sha256)], "locked"))
    prepare_download_verified(rctx)
    rctx.report_progress("looking up %s in the package index" % filename)
    url, auth = _resolve_url(rctx, filename, sha256)
    rctx.report_progress("downloading %s" % filename)
    download_verified(rctx, filename, url, output, sha256, auth)
