"""Every command that writes a file at the end of its work refuses, before the work starts, a path
it could not write: exit 2 and one line, the work never run."""

from __future__ import annotations

import argparse
import importlib

import pytest

import bench.eval.ppl
import bench.routing.labels
import engines.quantization.build
from gateway.cli.main import main
from gateway.cli.output_paths import check_output_dir, check_output_file
from gateway.cli.usage_error import UsageError

# The module, not the function gateway/cli/__init__.py exports under the same name.
cli_main = importlib.import_module("gateway.cli.main")


@pytest.fixture
def runs(monkeypatch) -> list[str]:
    """The commands that started their work; none of them does any."""
    started: list[str] = []
    build = cli_main._build_parser

    def parser_without_work():
        parser = build()
        bench = _choices(parser)["bench"]
        for name, sub in _choices(bench).items():
            sub.set_defaults(run=lambda args, name=name: started.append(name) or 0)
        return parser

    monkeypatch.setattr(cli_main, "_build_parser", parser_without_work)
    monkeypatch.setattr(bench.eval.ppl, "run_ppl_eval", lambda *a, **k: started.append("ppl") or 0)
    monkeypatch.setattr(engines.quantization.build, "quantize_to_dir",
                        lambda *a, **k: started.append("quantize") or a[3])
    return started


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def _json_benchmarks() -> list[str]:
    bench = _choices(cli_main._build_parser())["bench"]
    return [name for name, sub in _choices(bench).items()
            if any("--json" in a.option_strings for a in sub._actions)]


def _unwritable(tmp_path) -> dict[str, str]:
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    return {"proc": "/proc/tiergate-test/out.json", "directory": str(tmp_path / "a-dir"),
            "under-a-file": str(tmp_path / "a-file" / "out.json")}


def _refused(capsys, argv: list[str], option: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err and "Traceback" not in err, err


@pytest.mark.parametrize("where", ["proc", "directory", "under-a-file"])
@pytest.mark.parametrize("name", _json_benchmarks())
def test_bench_json_path(tmp_path, capsys, runs, name, where):
    _refused(capsys, ["bench", name, "--json", _unwritable(tmp_path)[where]], "--json")
    assert runs == []


@pytest.mark.parametrize("where", ["proc", "directory", "under-a-file"])
def test_eval_ppl_json_path(tmp_path, capsys, runs, where):
    _refused(capsys, ["eval", "ppl", "--json", _unwritable(tmp_path)[where], "--no-speed"], "--json")
    assert runs == []


def test_report_dir_that_is_a_file(tmp_path, capsys, runs):
    (tmp_path / "report").write_text("x")
    _refused(capsys, ["bench", "offline", "--json", str(tmp_path / "o.json"), "--report", str(tmp_path / "report")],
             "--report")
    assert runs == []


@pytest.mark.parametrize("out", ["/proc/tiergate-test", "a-file"])
def test_quantize_out(tmp_path, capsys, runs, out):
    (tmp_path / "a-file").write_text("x")
    target = out if out.startswith("/") else str(tmp_path / out)
    _refused(capsys, ["quantize", "--method", "int8", "--out", target], "--out")
    assert runs == []


def test_routing_labels_out(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(bench.routing.labels, "collect_labels", lambda *a: started.append(a) or 0)
    _refused(capsys, ["bench", "routing-labels", "--out", str(tmp_path)], "--out")
    assert started == []


def test_writable_paths_pass_and_run(tmp_path, capsys, runs):
    # Missing parent directories are created by the writers, so they are fine here.
    assert main(["bench", "decode", "--json", str(tmp_path / "new" / "d.json")]) == 0
    assert main(["eval", "ppl", "--json", str(tmp_path / "p.json")]) == 0
    assert main(["quantize", "--method", "int8", "--out", str(tmp_path / "q")]) == 0
    assert runs == ["decode", "ppl", "quantize"]


def test_checks_create_nothing(tmp_path):
    check_output_file(str(tmp_path / "x" / "out.json"), "--json")
    check_output_dir(str(tmp_path / "d"), "--report")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError):
        check_output_dir("/proc/tiergate-test", "--report")


@pytest.mark.parametrize("argv, option", [
    (["bench", "gateway", "--json", ""], "--json"),
    (["bench", "offline", "--json", "OUT/o.json", "--report", ""], "--report"),
    (["eval", "ppl", "--json", " "], "--json"),
    (["quantize", "--method", "int8", "--out", ""], "--out"),
])
def test_an_empty_path_is_refused_not_skipped(tmp_path, capsys, runs, argv, option):
    _refused(capsys, [a.replace("OUT", str(tmp_path)) for a in argv], option)
    assert runs == []


@pytest.mark.parametrize("report", ["same", "same/below"])
def test_a_json_file_where_the_report_directory_goes_is_refused(tmp_path, capsys, runs, report):
    _refused(capsys, ["bench", "offline", "--json", str(tmp_path / "same"), "--report", str(tmp_path / report)],
             "--report")
    assert runs == []
    # beside or inside the report directory is fine
    rep = str(tmp_path / "rep")
    assert main(["bench", "offline", "--json", str(tmp_path / "rep" / "o.json"), "--report", rep]) == 0
