"""Response-length traces: plain and gzipped CSV, model filter, bad values named."""

import gzip

import pytest

from oppo.catalog.lengths import load_lengths


def test_lengths_plain_and_gzip(tmp_path):
    text = "model,prompt_tokens,response_tokens\na,3,10\nb,4,20\n"
    (tmp_path / "l.csv").write_text(text)
    with gzip.open(tmp_path / "l.csv.gz", "wt") as fh:
        fh.write(text)
    for name in ("l.csv", "l.csv.gz"):
        trace = load_lengths(tmp_path / name)
        assert trace.response_tokens.tolist() == [10, 20] and trace.prompt_tokens.tolist() == [3, 4]
    assert load_lengths(tmp_path / "l.csv", model="b").response_tokens.tolist() == [20]


@pytest.mark.parametrize(
    "text, message",
    [
        ("tokens\n1\n", "needs a 'response_tokens' column"),
        ("response_tokens\n", "needs a 'response_tokens' column"),
        ("response_tokens\n-3\n", "non-negative integer"),
        ("response_tokens\n5\ninf\n", "non-negative integer"),  # float('inf') parses; int() of it would not
        ("response_tokens\n1e400\n", "non-negative integer"),
        ("response_tokens\nabc\n", "non-numeric"),
        ("response_tokens\n\n5\n", None),  # csv skips blank lines
        ("response_tokens,x\n,1\n", "empty value"),
    ],
)
def test_lengths_errors(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    if message is None:
        assert load_lengths(path).response_tokens.tolist() == [5]
    else:
        with pytest.raises(ValueError, match=message):
            load_lengths(path)
    with pytest.raises(FileNotFoundError):
        load_lengths(tmp_path / "missing.csv")
