from __future__ import annotations

import pytest

from rank_dataset.core.parsers import LineError, parse_json, parse_label, parse_line, resolve_parser


def test_label_splits_at_the_last_run_of_whitespace() -> None:
    assert parse_label("a/b c.JPEG \t 12") == ("a/b c.JPEG", 12)
    assert parse_label("x -1") == ("x", -1)
    with pytest.raises(LineError, match="expected '<path> <integer label>'"):
        parse_label("nolabel")
    with pytest.raises(LineError, match="label 'cat' is not an integer"):
        parse_label("img.jpg cat")


def test_json() -> None:
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(LineError, match="invalid JSON"):
        parse_json("{not json")


def test_resolve() -> None:
    assert resolve_parser(None) is None
    assert resolve_parser("json") is parse_json
    assert resolve_parser(str.upper) is str.upper
    with pytest.raises(ValueError, match="parser must be None, 'json', 'label' or a callable"):
        resolve_parser("yaml")


@pytest.mark.parametrize("line", ["x" * 10_000_000, "y" * 5_000_000 + " " + "z" * 5_000_000, "{" + "1" * 10_000_000])
def test_messages_quote_at_most_about_200_characters_of_a_line(line: str) -> None:
    parse = parse_json if line.startswith("{") else parse_label
    with pytest.raises(LineError) as err:
        parse(line)
    message = str(err.value)
    assert len(message) < 600 and f"({len(line):,} characters)" in message


def test_parse_line_names_where_only_on_an_error() -> None:
    calls: list[int] = []

    def where() -> str:
        calls.append(1)
        return "f.txt:7"

    assert parse_line(None, "a 1", where) == "a 1"
    assert parse_line(parse_label, "a 1", where) == ("a", 1)
    assert calls == []
    with pytest.raises(ValueError, match=r"^f.txt:7: ") as info:
        parse_line(parse_json, "not json", where)
    assert calls == [1] and not isinstance(info.value, LineError)
