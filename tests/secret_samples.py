"""Secret samples for the scan tests, built at run time so that the repository itself never looks like a leak.

Each rule family we rely on has a positive sample (a well-formed secret of that vendor, random but fixed
by a seed) and a negative one (something a careless rule would take for it: too short, a public key, a
documentation example). ``FAMILIES`` maps a family to the catalogue rule id its positive sample must hit.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from dataclasses import dataclass

_ALNUM = string.ascii_letters + string.digits
_UPPER32 = string.ascii_uppercase + "234567"


@dataclass(frozen=True)
class Family:
    """A rule family: the catalogue rules its positive sample may hit, and both samples (file contents)."""

    rules: tuple[str, ...]
    positive: str
    negative: str
    filename: str = "config.py"


def _random(rng: random.Random, n: int, alphabet: str = _ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _pem(kind: str, body: str) -> str:
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join(["-----BEGIN " + kind + "-----", *lines, "-----END " + kind + "-----"]) + "\n"


def families(pypi_prefix: str, seed: int = 17) -> dict[str, Family]:
    """Every family's samples. ``pypi_prefix`` is the fixed start of PyPI tokens, read from the catalogue's
    own rule (it encodes the registry's host name, which is written nowhere in this repository)."""
    rng = random.Random(seed)
    r = lambda n, alphabet=_ALNUM: _random(rng, n, alphabet)  # noqa: E731 - a short local alias
    letters = string.ascii_letters
    word = "-_"
    key_body = base64.b64encode(rng.randbytes(600)).decode()
    jwt_header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    jwt_payload = _b64url(json.dumps({"sub": r(12), "name": r(8), "iat": 1700000000}).encode())
    aws_id = "AKIA" + r(16, _UPPER32)
    service_account = {
        "type": "service_account",
        "project_id": "demo-" + r(6).lower(),
        "private_key_id": r(40, string.hexdigits.lower()),
        "private_key": _pem("PRIVATE KEY", key_body),
        "client_email": "ci@demo.iam.gserviceaccount.com",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
    }
    public_account = {k: v for k, v in service_account.items() if k != "private_key"}
    azure = f"DefaultEndpointsProtocol=https;AccountName=demo{r(4).lower()};"
    return {
        "huggingface-user": Family(
            ("betterleaks.huggingface-access-token",),
            f"HF_TOKEN=hf_{r(34, letters)}\n",
            f"HF_TOKEN=hf_{r(20, letters)}\n",
            ".env",
        ),
        "huggingface-org": Family(
            ("betterleaks.huggingface-organization-api-token",),
            f'token = "api_org_{r(34, letters)}"\n',
            f'token = "api_org_{r(12, letters)}"\n',
        ),
        "openai": Family(
            ("betterleaks.openai-api-key",),
            f'OPENAI_API_KEY = "sk-proj-{r(74, _ALNUM + word)}T3Blbk' + f'FJ{r(74, _ALNUM + word)}"\n',
            f'OPENAI_API_KEY = "sk-proj-{r(156, _ALNUM)}"\n',
        ),
        "anthropic": Family(
            ("betterleaks.anthropic-api-key",),
            f'ANTHROPIC_API_KEY = "sk-ant-api03-{r(93, _ALNUM + word)}AA"\n',
            f'ANTHROPIC_API_KEY = "sk-ant-api03-{r(20)}"\n',
        ),
        "github": Family(
            ("betterleaks.github-pat",), f'GITHUB_TOKEN = "ghp_{r(36)}"\n', 'GITHUB_TOKEN = "ghp_short"\n'
        ),
        "gitlab": Family(
            ("betterleaks.gitlab-pat",),
            f'GITLAB_TOKEN = "glpat-{r(20)}"\n',
            f'GITLAB_TOKEN = "glpat-{r(6)}"\n',
        ),
        "slack": Family(
            ("betterleaks.slack-bot-token",),
            f'SLACK = "xoxb-{r(12, string.digits)}-{r(13, string.digits)}-{r(24)}"\n',
            'SLACK = "xoxb-notatoken"\n',
        ),
        "aws": Family(
            ("betterleaks.aws-access-token",),
            f"aws_access_key_id = {aws_id}\naws_secret_access_key = {r(40, _ALNUM + '/+')}\n",
            "aws_access_key_id = AKIA" + "IOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/"
            "bPxRfiCYEXAMPLEKEY\n",
            "credentials.ini",
        ),
        "gcp-service-account": Family(
            ("betterleaks.gcp-service-account",),
            json.dumps(service_account, indent=2) + "\n",
            json.dumps(public_account, indent=2) + "\n",
            "service-account.json",
        ),
        "azure": Family(
            ("betterleaks.azure-storage-account-key",),
            f"AZURE_STORAGE_CONNECTION_STRING={azure}AccountKey={base64.b64encode(rng.randbytes(64)).decode()}\n",
            f"AZURE_STORAGE_CONNECTION_STRING={azure}AccountKey={r(12)}\n",
            ".env",
        ),
        "stripe": Family(
            ("betterleaks.stripe-access-token",),
            f'STRIPE_KEY = "sk_live_{r(24)}"\n',
            'STRIPE_KEY = "sk_live_abc"\n',
        ),
        "npm": Family(
            # Kingfisher reports the overlapping Veles rule for it.
            ("betterleaks.npm-access-token", "veles.secrets/npmjsaccesstoken"),
            f"//registry/:_authToken=npm_{r(36, string.ascii_lowercase + string.digits)}\n",
            f"//registry/:_authToken=npm_{r(12, string.ascii_lowercase)}\n",
            ".npmrc",
        ),
        "pypi": Family(
            ("betterleaks.pypi-upload-token",),
            f"password = {pypi_prefix}{r(80, _ALNUM + word)}\n",
            f"password = {pypi_prefix}{r(10)}\n",
            "pypirc.cfg",
        ),
        "private-key": Family(
            ("betterleaks.private-key",),
            _pem("RSA PRIVATE KEY", key_body),
            _pem("PUBLIC KEY", key_body),
            "deploy.pem",
        ),
        "jwt": Family(
            ("betterleaks.jwt",),
            f'AUTH = "{jwt_header}.{jwt_payload}.{_b64url(rng.randbytes(32))}"\n',
            f'AUTH = "{jwt_header[:10]}.{r(5)}"\n',
        ),
    }


def pypi_prefix(pattern: str) -> str:
    """The literal start of the catalogue's PyPI token pattern: ``pypi-`` and a base64 macaroon head."""
    match = re.match(r"[A-Za-z0-9-]+", pattern)
    if match is None or not match[0].startswith("pypi-"):
        raise ValueError(
            f"expected a PyPI token pattern starting with a literal 'pypi-...', found {pattern!r}"
        )
    return match[0]
