"""Benchmark inputs that cannot work are refused before any model is loaded, with exit 2 and one
line naming the option: a gain model that is not there, a label file that is a directory or not
text, a dtype list with a stranger in it, a --compare-header without a colon."""

from __future__ import annotations

import pytest

import bench.routing.labels
import bench.routing.runner
from gateway.cli import main


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(bench.routing.runner, "load_model", refuse)
    monkeypatch.setattr(bench.routing.labels, "load_model", refuse)


def _refused(capsys, argv: list[str], option: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err and "Traceback" not in err, err
    return err


def test_an_unknown_gain_model(tmp_path, capsys, no_model_loads):
    err = _refused(capsys, ["bench", "routing", "--json", str(tmp_path / "r.json"), "--num-prompts", "2",
                            "--gain-model", "smollm2-qwen2.5-codr"], "--gain-model")
    assert "smollm2-qwen2.5-coder" in err          # the bundled names are listed
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("make,reason", [
    (lambda d: d, "is a directory"),
    (lambda d: (d / "l.jsonl").write_bytes(b'{"id": 1}\n\xff\xfe\n') and d / "l.jsonl", "not UTF-8"),
])
def test_routing_train_labels_that_are_not_a_label_file(tmp_path, capsys, no_model_loads, make, reason):
    labels = make(tmp_path)
    err = _refused(capsys, ["bench", "routing-train", "--labels", str(labels), "--out", str(tmp_path / "g.json"),
                            "--prefill-model", "none"], "--labels")
    assert reason in err and not (tmp_path / "g.json").exists()


def test_routing_labels_out_that_is_not_a_label_file(tmp_path, capsys, no_model_loads):
    out = tmp_path / "labels.jsonl"
    out.write_bytes(b"\xff\xfe not text\n")
    assert "not UTF-8" in _refused(capsys, ["bench", "routing-labels", "--out", str(out), "--num-prompts", "1"],
                                   "--out")
    assert out.read_bytes() == b"\xff\xfe not text\n"       # left as it was


@pytest.mark.parametrize("dtypes", ["float32,garbage", "", "float32,float32"])
def test_decode_dtypes_are_checked_while_parsing(tmp_path, capsys, dtypes):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "decode", "--json", str(tmp_path / "d.json"), "--dtypes", dtypes])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dtypes" in err


def test_a_compare_header_without_a_colon_is_named_as_such(tmp_path, capsys):
    err = _refused(capsys, ["bench", "serve", "--json", str(tmp_path / "s.json"), "--compare-header", "nocolon"],
                   "--compare-header")
    assert "--header " not in err


@pytest.mark.parametrize("argv, option", [
    (["bench", "routing-labels", "--out", ""], "--out"),
    (["bench", "routing-train", "--labels", "", "--out", "OUT/g.json"], "--labels"),
    (["bench", "routing-train", "--labels", "OUT/l.jsonl", "--out", " "], "--out"),
])
def test_an_empty_path_is_refused(tmp_path, capsys, no_model_loads, argv, option):
    _refused(capsys, [a.replace("OUT", str(tmp_path)) for a in argv], option)
