"""The ``b12x`` command on user errors: usage errors exit 2 from the parser
before any work starts, runtime failures exit 1 with one line, no traceback."""

from __future__ import annotations

import subprocess
import sys

import b12x
import pytest
import torch
from b12x import cli
from b12x.bench import plan as plan_bench

USAGE = {
    "demo --gpus -1": "argument --gpus: expected an integer >= 0, got '-1'",
    "bench plan --number 0": "argument --number: expected an integer >= 1, got '0'",
    "bench plan --number -5": "argument --number: expected an integer >= 1, got '-5'",
    "bench plan --number 2.5": "argument --number: expected an integer >= 1, got '2.5'",
    "bench plan --repeats 0": "argument --repeats: expected an integer >= 1, got '0'",
    "bench extract --repeats 0": "argument --repeats: expected an integer >= 1, got '0'",
    "bench lookup --iterations 0": "argument --iterations: expected an integer >= 1, got '0'",
    "bench lookup --warmup -1": "argument --warmup: expected an integer >= 0, got '-1'",
    "bench lookup --declarations 64 0": "argument --declarations: expected an integer >= 1",
    "bench indexer --iters 0": "argument --iters: expected an integer >= 1, got '0'",
    "bench indexer --torch-iters -2": "argument --torch-iters: expected an integer >= 1",
    "bench allreduce --gpus 1": "argument --gpus: expected an integer >= 2, got '1'",
    "bench allreduce --samples 0": "argument --samples: expected an integer >= 1, got '0'",
    "bench plan --device garbage": (
        "argument --device: expected cpu, cuda or cuda:N (N <= 127), got 'garbage'"
    ),
    "bench plan --device cuda:300": "argument --device: expected cpu, cuda or cuda:N (N <= 127)",
    "bench plan --rows 0": "argument --rows: expected an integer >= 1, got '0'",
    "bench plan --heads 0": "argument --heads: expected an integer >= 1, got '0'",
    "bench plan --width -1": "argument --width: expected an integer >= 1, got '-1'",
    "bench plan --topk 100": "argument --topk: expected one of 512, 1024, 2048, got '100'",
    "bench plan --topk big": "argument --topk: expected one of 512, 1024, 2048, got 'big'",
}


@pytest.fixture
def no_work(monkeypatch):
    """Any benchmark or demo that starts running fails the test."""

    def started(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    for mod in ("plan", "extract", "lookup", "indexer", "allreduce"):
        monkeypatch.setattr(f"b12x.bench.{mod}.run", started)
    monkeypatch.setattr("b12x.demo.run_demo", started)


@pytest.mark.parametrize("argv", list(USAGE))
def test_usage_errors_exit_2_before_any_work(argv, capsys, no_work):
    with pytest.raises(SystemExit) as e:
        cli.main(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert USAGE[argv] in err.strip().splitlines()[-1], err


def test_json_into_a_missing_directory_is_refused_before_the_benchmark(tmp_path, capsys, no_work):
    target = tmp_path / "missing" / "out.json"
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "plan", "--json", str(target)])
    assert e.value.code == 2
    assert f"argument --json: expected a file in an existing directory, got '{target}'" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        cli.main(["bench", "plan", "--json", str(tmp_path)])  # a directory
    assert "got the directory" in capsys.readouterr().err


def test_json_into_an_existing_directory_is_written(tmp_path, capsys):
    target = tmp_path / "plan.json"
    argv = ["bench", "plan", "--device", "cpu", "--number", "4", "--repeats", "1"]
    assert cli.main([*argv, "--rows", "2", "--width", "2", "--json", str(target)]) == 0
    assert target.read_text().startswith("{")
    assert f"wrote {target}" in capsys.readouterr().out


def one_line_failure(argv, capsys):
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="checks the too-few-GPUs path")
def test_allreduce_without_the_gpus_is_one_line(capsys):
    line = one_line_failure(["bench", "allreduce", "--gpus", "2"], capsys)
    found = torch.cuda.device_count()
    assert line == f"b12x bench allreduce: error: needs 2 GPUs, this machine has {found}"


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks the no-GPU path")
def test_a_cuda_device_without_a_gpu_is_one_line(capsys):
    line = one_line_failure(["bench", "plan", "--device", "cuda", "--number", "1"], capsys)
    assert line.startswith("b12x bench plan: error: Caps: device expected a CUDA device this")


def test_a_b12x_error_at_run_time_is_one_line(capsys):
    argv = ["bench", "plan", "--device", "cpu", "--heads", "65", "--number", "1"]
    line = one_line_failure(argv, capsys)
    assert (
        line == "b12x bench plan: error: Caps: num_q_heads expected an integer in [1, 64], got 65"
    )


def test_an_unexpected_exception_keeps_its_traceback(monkeypatch):
    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(plan_bench, "run", bug)
    with pytest.raises(ZeroDivisionError):
        cli.main(["bench", "plan", "--device", "cpu"])


def test_the_console_command_exits_with_the_codes():
    usage = subprocess.run(
        [sys.executable, "-m", "b12x", "bench", "plan", "--number", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    runtime = subprocess.run(
        [sys.executable, "-m", "b12x", "bench", "plan", "--device", "cpu", "--heads", "65"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert runtime.returncode == 1
    assert runtime.stderr.strip().splitlines() == [
        "b12x bench plan: error: Caps: num_q_heads expected an integer in [1, 64], got 65"
    ]


# --- issue 21, item 10 ---------------------------------------------------------------------


def test_version_prints_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"b12x {b12x.__version__}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_bench_indexer_without_a_gpu_is_one_line_on_stderr_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "indexer.json"
    line = one_line_failure(["bench", "indexer", "--json", str(out)], capsys)
    assert line == "b12x bench indexer: error: no supported CUDA device: nothing to measure"
    assert not out.exists()
    assert capsys.readouterr().out == ""


def test_help_texts_cite_nothing_the_user_does_not_have(capsys):
    texts = {}
    for argv in (["bench", "--help"], ["bench", "lookup", "--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        texts[argv[0]] = text = capsys.readouterr().out
        assert "spec §" not in text and "reference-" not in text, (argv, text)
    assert "0 runs only the CPU steps" in " ".join(texts["demo"].split())
