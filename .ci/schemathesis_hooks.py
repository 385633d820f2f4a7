"""Schemathesis hooks for the fuzz step of scripts/test.

Every participant URL field of idem's spec has `format: uri`. Here each becomes a URL of
the loopback participant (.ci/fuzz_participant.py, port IDEM_FUZZ_PARTICIPANT_PORT), so no
generated request can make idem call a host outside this machine; the published spec keeps
accepting any http(s) URL.
"""

import os

import schemathesis

PORT = int(os.environ["IDEM_FUZZ_PARTICIPANT_PORT"])
LOOPBACK_URL = rf"^http://127\.0\.0\.1:{PORT}/[a-z]{{0,8}}$"


def _confine(node):
    if isinstance(node, dict):
        if node.get("format") == "uri":
            del node["format"]
            node["pattern"] = LOOPBACK_URL
        for value in node.values():
            _confine(value)
    elif isinstance(node, list):
        for value in node:
            _confine(value)


@schemathesis.hook
def before_load_schema(ctx, raw_schema):
    _confine(raw_schema)


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    """idem takes a write only with `Content-Type: application/json` (docs/security.md,
    *Web pages*), which its clients send even without a body (an optional submit body, a
    revoke); a spec cannot say so for a POST without one, so without this such cases only
    meet the 415."""
    if case.method.upper() == "POST":
        case.headers = {"Content-Type": "application/json", **(case.headers or {})}
