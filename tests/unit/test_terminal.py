"""Producers' text printed for people (conveyor.platform.terminal): control characters
escaped in log lines and `dlq show`, newlines kept where a message or traceback has
lines of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor.platform.terminal import visible


def test_control_characters_are_escaped_and_plain_text_is_untouched() -> None:
    text = "orders/k"
    assert visible(text) is text
    assert visible("k\x1b[31mRED\r\x00\x7f\x9b") == "k\\x1b[31mRED\\r\\x00\\x7f\\x9b"
    assert visible("a\nb\tc") == "a\\nb\\tc"
    assert visible("a\nb\tc\x1b", lines=True) == "a\nb\tc\\x1b"
    assert visible("é ü 東京") == "é ü 東京"


def test_bidirectional_controls_and_unicode_line_breaks_are_escaped() -> None:
    """A right-to-left override reorders what the terminal shows (`dlq show` printed an
    error's U+202E raw); U+2028/U+2029 and U+0085 end a line for `str.splitlines` and
    the tools built on it, so a reason holding one forged a line."""
    assert visible("ok\u202eevil\u2066x\u200f") == "ok\\u202eevil\\u2066x\\u200f"
    assert visible("a\u2028b\u2029c\x85d") == "a\\u2028b\\u2029c\\x85d"
    assert visible("a\nb\u2028c\u202e", lines=True) == "a\nb\\u2028c\\u202e"
    assert len(visible("reason\u2028conveyor: error: forged").splitlines()) == 1


def test_a_cli_log_line_shows_a_keys_escape_sequence_as_text() -> None:
    """The logging the CLI sets up (a worker's warnings name keys and headers)."""
    script = (
        "import logging\n"
        "from conveyor.cli import _setup_logging\n"
        "_setup_logging(None, 'worker')\n"
        "logging.getLogger('conveyor.test').warning('dead-lettered %s', 'orders/k\\x1b[31mRED')\n"
        "logging.getLogger('conveyor.test').warning('key %s of %d', 'a\\nERROR forged', 3)\n"
        "logging.getLogger('conveyor.test').warning('namespace %r', 'n' * 2_000_000)\n"
        "try:\n"
        "    raise ValueError('bad\\rvalue')\n"
        "except ValueError:\n"
        "    logging.getLogger('conveyor.test').exception('failed')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "\x1b" not in err and "\r" not in err
    assert "dead-lettered orders/k\\x1b[31mRED" in err
    assert "key a\\nERROR forged of 3" in err  # a value's newline forges no line
    assert not any(line.startswith("ERROR forged") for line in err.splitlines())
    assert "Traceback (most recent call last):\n" in err  # a traceback keeps its lines
    [long] = [line for line in err.splitlines() if "namespace 'nnn" in line]
    assert long.endswith("n… (2,000,002 characters)") and len(long) < 2200  # not 2 MB
    assert "ValueError: bad\\rvalue" in err


def test_a_dlq_table_shows_a_producers_markup_emoji_and_escapes_as_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """rich reads a cell's ``[/x]`` as markup: a stream key so written ended `conveyor
    dlq list` in a MarkupError traceback."""
    from conveyor.cli.render import letters_view, print_table
    from conveyor.platform.ids import StreamId
    from conveyor.platform.letters import StoredLetter
    from conveyor.platform.message import DeadLetter, Message

    key = "[/x] [bold]k :smile: \x1b[31mRED"
    letter = DeadLetter.of(Message("m-1", StreamId("orders", key), b"{}"), "shop.h",
                           "[/y] failed", 1, "ValueError")
    for wide in (False, True):
        print_table(letters_view([StoredLetter("0-1", letter)], "shop", 1, wide, 200),
                    whole_rows=wide)
        out = capsys.readouterr().out
        assert "orders/[/x] [bold]k :smile:" in out and "\\x1b[31mRED" in out, out
        assert "[/y] failed" in out and "\x1b" not in out


def test_a_lines_value_keeps_its_newlines_and_a_producers_value_does_not() -> None:
    """The loop watchdog's stack (conveyor.platform.watchdog) is a ``Lines``: a frame a
    line, as docs/handlers.md shows it; a key beside it still forges no line."""
    import logging

    from conveyor.platform.terminal import Lines, VisibleFormatter

    record = logging.makeLogRecord(
        {"msg": "key %s blocked at:\n%s", "args": ("k\nERROR forged", Lines("a\n  b\x1b"))})
    shown = VisibleFormatter("%(message)s").format(record)
    assert shown == "key k\\nERROR forged blocked at:\na\n  b\\x1b"
