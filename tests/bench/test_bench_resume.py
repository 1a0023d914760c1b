"""Long ``ember bench`` runs: every selected row is in ``--out`` before it runs, a signal stops
the run with a table that says which rows were not run and why, and ``--resume`` continues
from the saved folder without measuring finished rows again."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ember.bench import cli

FAST = ["--repeat", "2", "--warmup", "1", "--compilers", "ember"]
HERE = os.path.dirname(__file__)


def saved_rows(out) -> dict[str, dict]:
    return {row["model"]: row for row in json.loads((out / "results.json").read_text())["rows"]}


def test_rows_not_yet_run_are_in_the_json_before_the_first_row_runs(tmp_path, monkeypatch,
                                                                      capsys):
    out = tmp_path / "run"
    monkeypatch.setenv("EMBER_TEST_OUT", str(out))
    monkeypatch.setenv("EMBER_TEST_SNAPSHOT", str(tmp_path / "snapshot.json"))
    assert cli.main(["bench", "--models", "bench_fakes:snapshot_out,mlp", *FAST,
                     "--no-isolate", "--out", str(out)]) == 0
    during = {row["model"]: row for row in
              json.loads((tmp_path / "snapshot.json").read_text())["rows"]}
    assert during["mlp"]["status"] == "not run"
    assert during["mlp"]["error"].startswith("not run: the run has not reached this model")
    after = saved_rows(out)
    assert after["mlp"]["status"] == after["bench_fakes:snapshot_out"]["status"] == "ok"
    log = (out / "run.log").read_text()
    assert "[1/2] bench_fakes:snapshot_out: eager" in log and "[2/2] mlp: eager" in log

    # --show prints a saved run's tables: here the file as it was while the run went on
    capsys.readouterr()
    assert cli.main(["bench", "--show", str(tmp_path / "snapshot.json")]) == 0
    shown = capsys.readouterr().out.splitlines()
    (mlp,) = [line for line in shown if line.startswith("mlp ")]
    assert mlp.split()[1:3] == ["n/a", "not"]          # eager ms n/a, ember "not run"
    assert any(line.startswith("note: mlp: not run: the run has not reached this model")
               for line in shown)


def test_resume_keeps_finished_rows_and_runs_the_rest(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["bench", "--models", "bench_fakes:tiny", *FAST, "--no-isolate",
                     "--out", str(out)]) == 0
    first = saved_rows(out)["bench_fakes:tiny"]
    capsys.readouterr()
    # The second command selects another model too: tiny is not measured again, mlp is.
    assert cli.main(["bench", "--models", "mlp,bench_fakes:tiny", *FAST, "--no-isolate",
                     "--out", str(out), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "resuming" in captured.err and "1 of the 2 selected rows are finished" in captured.err
    assert "[1/1] mlp: eager" in captured.err
    rows = saved_rows(out)
    assert list(rows) == ["bench_fakes:tiny", "mlp"]
    assert rows["bench_fakes:tiny"] == first and rows["mlp"]["status"] == "ok"
    assert json.loads((out / "results.json").read_text())["models"] == [
        "bench_fakes:tiny", "mlp"]
    assert any(line.startswith("geomean") for line in captured.out.splitlines())


def test_resume_runs_rows_that_were_not_run_and_keeps_other_rows(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["bench", "--models", "bench_fakes:slow_model,mlp", *FAST, "--no-isolate",
                     "--budget", "0.1", "--out", str(out)]) == 0
    assert saved_rows(out)["mlp"]["status"] == "skipped"
    assert cli.main(["bench", "--models", "mlp", *FAST, "--no-isolate", "--out", str(out),
                     "--resume"]) == 0
    rows = saved_rows(out)
    assert rows["mlp"]["status"] == "ok"
    assert rows["bench_fakes:slow_model"]["status"] == "ok"     # kept, though not selected


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "3"], "other settings: repeat 2 (saved) vs 3"),
    (["--compilers", "ember,bench_fakes:slow_compiler"], "compilers ['eager', 'ember'] (saved)"),
])
def test_resume_with_other_settings_is_a_usage_error(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["bench", "--models", "bench_fakes:tiny", *FAST, "--no-isolate",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--models", "bench_fakes:tiny", *FAST, "--no-isolate",
                  "--out", str(out), "--resume", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_needs_out(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--models", "mlp", "--resume"])
    assert exit_info.value.code == 2
    assert "--resume continues the run saved in --out DIR" in capsys.readouterr().err


def test_sigterm_stops_the_run_and_the_table_says_what_was_not_run(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "ember.bench", "--models",
         "bench_fakes:hanging,bench_fakes:tiny", *FAST, "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "logs" / "bench_fakes_hanging.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    rows = saved_rows(out)
    assert rows["bench_fakes:hanging"]["status"] == "interrupted"
    assert rows["bench_fakes:hanging"]["error"].startswith("interrupted by SIGTERM after")
    assert rows["bench_fakes:tiny"]["status"] == "not run"
    assert rows["bench_fakes:tiny"]["error"] == ("not run: the run was stopped by SIGTERM "
                                                 "before this model")
    lines = stdout.splitlines()
    assert any(line.split()[:2] == ["bench_fakes:hanging", "n/a"] and "interrupted" in line
               for line in lines), stdout
    assert any(line.split()[:2] == ["bench_fakes:tiny", "n/a"] and "not run" in line
               for line in lines), stdout
    assert "# stopped by SIGTERM: 1 model(s) not run; continue with --resume" in stderr
    assert "stopped by SIGTERM" in (out / "run.log").read_text()


def test_a_closed_output_pipe_does_not_end_the_run(tmp_path):
    # `ember bench ... | head -1`: the reader is gone after the first line; every later print
    # raises BrokenPipeError (Python ignores SIGPIPE), which used to end the run silently.
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "ember.bench", "--models", "bench_fakes:tiny,mlp", *FAST,
         "--no-isolate", "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    process.stderr.close()
    assert process.wait(timeout=300) == 0
    rows = saved_rows(out)
    assert rows["bench_fakes:tiny"]["status"] == rows["mlp"]["status"] == "ok"
    assert "[2/2] mlp: eager" in (out / "run.log").read_text()


def test_retry_failed_runs_failed_rows_again(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    models = ["--models", "bench_fakes:fails_until_fixed,bench_fakes:tiny"]
    assert cli.main(["bench", *models, *FAST, "--no-isolate", "--out", str(out)]) == 1
    assert saved_rows(out)["bench_fakes:fails_until_fixed"]["status"] == "error"
    tiny = saved_rows(out)["bench_fakes:tiny"]
    monkeypatch.setenv("EMBER_TEST_FIXED", "1")
    # plain --resume keeps the error row as finished (and still failed: the run exits 1)
    assert cli.main(["bench", *models, *FAST, "--no-isolate", "--out", str(out),
                     "--resume"]) == 1
    assert saved_rows(out)["bench_fakes:fails_until_fixed"]["status"] == "error"
    assert cli.main(["bench", *models, *FAST, "--no-isolate", "--out", str(out),
                     "--resume", "--retry-failed"]) == 0
    rows = saved_rows(out)
    assert rows["bench_fakes:fails_until_fixed"]["status"] == "ok"
    assert rows["bench_fakes:tiny"] == tiny            # an ok row is not measured again
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *models, "--out", str(out), "--retry-failed"])
    assert exit_info.value.code == 2
    assert "--retry-failed re-runs failed rows of a resumed run" in capsys.readouterr().err
