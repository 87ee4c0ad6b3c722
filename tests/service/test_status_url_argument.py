"""`status --url` that is not an http:// URL with a host and a port in range is a usage
error (exit 2, one line naming --url), checked before any read: not "cannot read the
daemon" (exit 1) with advice to check that it runs."""

from __future__ import annotations

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus


@pytest.mark.parametrize("url, words", [
    ("ftp://x/metrics", "only http://HOST[:PORT]/PATH URLs are read"),
    ("http://[::1", "is not a URL"),
    ("http://127.0.0.1:99999/metrics", "is not a URL"),
    ("127.0.0.1:19400", "only http://"),
])
def test_a_url_that_cannot_be_read_is_a_usage_error(url, words, capsys):
    assert main(["status", "--url", url]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "argument --url" in err and words in err
    assert "is the daemon running" not in err
