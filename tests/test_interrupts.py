"""Interrupting a parallel sweep: Ctrl-C twice or SIGTERM ends it within seconds, with exit
130, the resume command, no worker left behind and no partial folder; `--resume` then
finishes it to the table a clean run gives."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from sweep_files import write_sweep

GRID = """
parameters:
  workload.arrival.rate_per_s: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
"""
# Points of about half a second each, so that the interrupt lands while workers are
# busy (the first of six is done, the second under way, four queued).
SLOW = ["workload.num_requests=500", "engine.mode=reference"]
EXIT_WITHIN_S = 10.0


def sweep_file(folder: Path) -> Path:
    path = write_sweep(folder, GRID)
    text = path.read_text().replace("grid:", f"set: {SLOW}\ngrid:")
    path.write_text(text)
    return path


@contextlib.contextmanager
def ctrl_c_default() -> Iterator[None]:
    """Ctrl-C with its default meaning for a child spawned within, as a terminal's foreground
    job has it.

    A disposition of "ignored" survives exec, and a suite started as a background job of a
    non-interactive shell (`pytest &`) holds SIGINT ignored: the child would inherit that and
    rightly run on through Ctrl-C (Python keeps an inherited SIG_IGN). A handler does not
    survive exec, so one set here for the spawn gives the child the default."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start(spec: Path, out: Path, marker: str, *extra: str) -> subprocess.Popen[str]:
    """The sweep, with Ctrl-C's default meaning (`ctrl_c_default`)."""
    env = {**os.environ, "ORCASIM_TEST_MARK": marker}
    with ctrl_c_default():
        return subprocess.Popen([sys.executable, "-m", "orcasim.cli", "sweep", str(spec),
                                 "--out", str(out), "--workers", "2", "--no-progress", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)


def processes_marked(marker: str) -> list[int]:
    """Live processes whose environment carries `marker`: the sweep and its workers."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def finished_points(out: Path) -> list[Path]:
    """Points whose outcome is in place: not one still in its hidden temporary folder
    (`points/.<id>.tmp-*/`), which pathlib's `*` matches too and an interrupt removes."""
    return [p for p in out.glob("points/*/outcome.json") if not p.parent.name.startswith(".")]


def wait_for_first_point(out: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not finished_points(out):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no point finished in 120 s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def clean_table(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The table an uninterrupted run of the sweep gives (once for both signals)."""
    folder = tmp_path_factory.mktemp("clean")
    clean = start(sweep_file(folder), folder / "out", uuid.uuid4().hex)
    assert clean.wait(timeout=600) == 0
    return pd.read_csv(folder / "out" / "sweep.csv")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("signals", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM,)],
                         ids=["ctrl-c twice", "sigterm"])
def test_an_interrupted_parallel_sweep_stops_and_resumes(tmp_path: Path, signals: tuple[int, ...],
                                                         clean_table: pd.DataFrame) -> None:
    spec, out, marker = sweep_file(tmp_path), tmp_path / "out", uuid.uuid4().hex
    proc = start(spec, out, marker)
    wait_for_first_point(out, proc)
    sent_s = time.monotonic()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=EXIT_WITHIN_S)
    assert time.monotonic() - sent_s < EXIT_WITHIN_S
    # Its output says how far it got, should it not stop.
    assert proc.returncode == 130, (stdout, stderr)
    assert "--resume" in stderr and "Traceback" not in stderr, stderr
    time.sleep(0.5)
    assert processes_marked(marker) == [], "workers outlived the sweep"
    assert not [p for p in out.rglob(".*") if p.name != ".orcasim-results"], "partial files left"
    done_before = len(finished_points(out))
    assert 1 <= done_before < 6

    resumed = start(spec, out, marker, "--resume")
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert f"{6 - done_before} tasks run, {done_before} already done" in stdout
    pd.testing.assert_frame_equal(pd.read_csv(out / "sweep.csv"), clean_table)


QUICKSTART = str(Path(__file__).parents[1] / "scenarios" / "quickstart.yaml")
# Where a finder sends the signal, as a module is looked up, and what the code around the
# lookup makes of an exception raised there: lets it through, wraps it (as pydantic-core,
# building an orcasim model's validator as its module loaded, made it a SchemaError: exit 1,
# 5 of 120 SIGTERM'd runs) or swallows it (as pydantic-core hashing a literal's values did:
# the command went on to exit 0).
LANDINGS = {
    "the CLI looked up": ("orcasim.cli", "through", QUICKSTART),
    # Held, and taken as the CLI's load ends, before the command (whose error, a missing
    # file, would be exit 2).
    "a package's import as the CLI loads": ("yaml.error", "through", "nope.yaml"),
    "an orcasim module's import, wrapped": ("orcasim.scenario", "wrapped", QUICKSTART),
    "an orcasim module's import, swallowed": ("orcasim.scenario", "swallowed", QUICKSTART),
}


def orcasim_after(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`orcasim ARGS` as its entry point runs it, in a process that first runs `script`,
    with Ctrl-C's default meaning (`ctrl_c_default`)."""
    script += f"sys.argv = ['orcasim', *{list(args)!r}]\nfrom orcasim.__main__ import main\nmain()\n"
    with ctrl_c_default():
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120)


@pytest.mark.parametrize("landing", LANDINGS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_the_command_loads_is_quiet(sig: int, landing: str) -> None:
    """Ctrl-C in the first second of `orcasim run`, while its modules load, printed a
    traceback from inside an import (exit -2). The signal arrives exactly then here: a finder
    sends it as a module is looked up, inside the import that asked for it."""
    module, effect, scenario = LANDINGS[landing]
    script = (
        "import os, sys\n"
        "class Interrupting:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            sys.meta_path.remove(self)\n"
        "            try:\n"
        f"                os.kill(os.getpid(), {int(sig)})\n"
        "                for _ in range(1000): pass  # Python runs the handler here\n"
        "            except BaseException as e:\n"
        f"                if {effect!r} == 'through': raise\n"
        f"                if {effect!r} == 'wrapped': raise ImportError('SchemaError') from e\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupting())\n")
    done = orcasim_after(script, "validate", scenario)
    assert (done.returncode, done.stderr) == (130, "interrupted; nothing was left half-written\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_as_the_process_exits_changes_nothing(sig: int) -> None:
    """Once `orcasim validate` has said 'ok', an interrupt during the interpreter's teardown
    killed it (exit -15 or -2; 12 of 120 validations interrupted at random): Python hands its
    handlers back to the system's defaults there. The signal comes from an exit hook here."""
    script = (
        "import atexit, os, sys\n"
        f"atexit.register(lambda: os.kill(os.getpid(), {int(sig)}))\n")
    done = orcasim_after(script, "validate", QUICKSTART)
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout.endswith(": ok (2000 requests, 2 systems)\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_inside_exec_of_a_string_still_exits_130(tmp_path: Path, sig: int) -> None:
    """A KeyboardInterrupt leaving `exec` or `eval` of a string (as a dataclass or a named
    tuple is built, in a module imported late) marks the interpreter "interrupted": caught,
    told and ended with exit 130, `python -m orcasim` then killed itself with SIGINT (exit
    -2; once in CI). The commands' interrupt is a subclass, which CPython does not mark."""
    script = (
        "import sys\n"
        "from orcasim.exits import sigterm_as_interrupt\n"
        "try:\n"
        "    with sigterm_as_interrupt():\n"
        "        print('ready', flush=True)\n"
        "        while True:\n"
        "            exec('total = 0\\nfor i in range(10**6): total += i')\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    # As a module (-m), as `python -m orcasim` runs: `-c` and a script file exit at once
    # on SystemExit, before CPython looks at the mark.
    (tmp_path / "looping.py").write_text(script)
    with ctrl_c_default():
        proc = subprocess.Popen([sys.executable, "-m", "looping"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.2)  # well inside an exec: the loop spends nearly all its time there
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err


def test_workers_start_with_ctrl_c_held_back_and_then_ignore_it() -> None:
    """A worker of the local pool still importing when Ctrl-C reached the process group
    died of it with a traceback (3 of 22 interrupted sweeps, none of 22 since): the pool's
    workers now start with SIGINT blocked, and each drops it (ignored, then unblocked)
    before any task. The parent gets its own back when its block ends."""
    from orcasim.sweeps.backends import _interrupts_blocked, _start_worker

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    handler = signal.getsignal(signal.SIGINT)
    try:
        with _interrupts_blocked():
            assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
            # To this thread, which blocks it: sent to the process, another thread of the
            # test run (one a pool left) could take it, as a KeyboardInterrupt here.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # held, then dropped
            _start_worker(os.getppid())  # its watch of the parent never fires here
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as the block left it
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_pools_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL of a sweep of --workers 2 left its idle workers waiting forever, holding its
    stdout and stderr, so a caller reading them hung (a tester's finding, 720 s)."""
    script = tmp_path / "pool.py"
    script.write_text(
        "import time\nfrom orcasim.sweeps.backends import execute_jobs\n"
        "if __name__ == '__main__':\n"
        "    for _ in execute_jobs([0.2, 60.0, 60.0], time.sleep, lambda t, e: None, 'local', 2):\n"
        "        print('done', flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "done\n"  # the pool is up

    def children() -> list[int]:
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                lines = status.read_text().splitlines()
            except OSError:
                continue
            ppid = next((line.split()[1] for line in lines if line.startswith("PPid:")), "")
            if ppid == str(proc.pid):
                found.append(int(status.parent.name))
        return found

    workers = children()
    assert workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in workers):
        time.sleep(0.1)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()
             and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_ctrl_c_after_the_results_are_written_changes_nothing(tmp_path: Path) -> None:
    """Pressed as `orcasim run` printed 'results written' (its results whole), Ctrl-C ended
    it with exit 130 and 'nothing was left half-written', or killed it (exit -2), while the
    interpreter tore down pandas and matplotlib (about 0.8 s): 3 of 3 presses. Ignored from
    the write on, the run exits 0."""
    scenario = Path(__file__).parents[1] / "scenarios" / "quickstart.yaml"
    for trial in range(3):
        with ctrl_c_default():
            proc = subprocess.Popen(
                [sys.executable, "-m", "orcasim.cli", "run", str(scenario), "--set",
                 "workload.num_requests=100", "--out", str(tmp_path / f"r{trial}"), "--no-plots"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("results written"):
                proc.send_signal(signal.SIGINT)
                break
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "interrupted" not in err, (proc.returncode, err)
        assert (tmp_path / f"r{trial}" / "summary.json").exists()
