"""Out-of-range numbers, NaN and malformed lists are refused while the command line is parsed:
exit 2 and one line naming the option, before any model, dataset or server is touched."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli import main
from gateway.cli.arg_types import (port_number, positive_float, positive_int, positive_int_list,
                                   positive_int_list_or_empty, positive_rate)


def _refused(capsys, argv: list[str], option: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert option in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["80000", "65536", "-1", "http"])
def test_serve_port_outside_the_tcp_range(capsys, port):
    _refused(capsys, ["serve", "--port", port], "--port")


@pytest.mark.parametrize("count", ["0", "-3"])
def test_eval_ppl_sequences_at_least_one(tmp_path, capsys, count):
    _refused(capsys, ["eval", "ppl", "--json", str(tmp_path / "p.json"), "--sequences", count], "--sequences")


@pytest.mark.parametrize("argv, option", [
    (["offline", "--hf-batch-sizes", "abc"], "--hf-batch-sizes"),
    (["offline", "--hf-batch-sizes", "8,0"], "--hf-batch-sizes"),
    (["offline", "--num-requests", "0", "--hf-batch-sizes", ""], "--num-requests"),
    (["offline", "--engine-processes", "-1"], "--engine-processes"),
    (["decode", "--repeats", "0"], "--repeats"),
    (["gateway", "--rate", "nan"], "--rate"),
    (["gateway", "--seconds", "inf"], "--seconds"),
    (["soak", "--minutes", "nan"], "--minutes"),
    (["soak", "--window-seconds", "nan"], "--window-seconds"),
    (["spec", "--batch-sizes", "0"], "--batch-sizes"),
    (["profile", "--batch-sizes", ""], "--batch-sizes"),
    (["serve", "--request-rate", "nan"], "--request-rate"),
])
def test_bench_arguments_out_of_range(tmp_path, capsys, argv, option):
    _refused(capsys, ["bench", argv[0], "--json", str(tmp_path / "b.json"), *argv[1:]], option)


def test_converters():
    assert positive_int("3") == 3
    assert port_number("0") == 0 and port_number("65535") == 65535
    assert positive_float("0.5") == 0.5
    assert positive_rate("inf") == float("inf")
    assert positive_int_list("8, 16") == [8, 16]
    assert positive_int_list_or_empty("") == []          # offline's "engine alone", spec's "no batched runs"
    for convert, text in [(positive_int, "1.5"), (positive_float, "-1"), (positive_float, "nan"),
                          (positive_rate, "nan"), (positive_rate, "0"), (positive_int_list, ","),
                          (positive_int_list_or_empty, "4,-2")]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)


def test_hash_key_that_is_not_utf8(capsys):
    # How Python hands over argv bytes that are not UTF-8 (b"\xff" -> "\udcff").
    assert main(["hash-key", "\udcff"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "UTF-8" in err


def test_hash_key_prints_the_digest(capsys):
    assert main(["hash-key", "secret"]) == 0
    assert capsys.readouterr().out.strip() == "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
