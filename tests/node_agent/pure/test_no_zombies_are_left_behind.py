"""Killed smoke tests leave no zombies, and an agent running as PID 1 reaps orphans without losing
the exit status of its own children.

Each scenario runs in a helper process made a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
orphans are re-parented to it exactly as they are to the agent when it is PID 1 in its container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from node_agent import childproc

SUBREAPER = """
import ctypes, json, os, signal, subprocess, sys, threading, time
from pathlib import Path
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER

def zombies():
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(entry.name))
    return found

def state(pid):
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
"""

SUPERVISOR_STOP = """
tmp = Path(sys.argv[1])
rank = "import os, time; open(os.environ['FIAR_EVENTS_FILE'], 'w').write(str(os.getpid())); time.sleep(300)"
sup = subprocess.Popen([sys.executable, "-m", "node_agent.smoke.supervisor", "--ranks", "2", "--events-dir",
                        str(tmp), "--port", "1", "--", sys.executable, "-c", rank])
files = [tmp / f"rank-{r}.jsonl" for r in range(2)]
deadline = time.monotonic() + 60
while not all(f.exists() and f.read_text() for f in files) and time.monotonic() < deadline:
    time.sleep(0.05)
ranks = [int(f.read_text()) for f in files]
sup.send_signal(signal.SIGTERM)  # the supervisor alone, as when it is the first of its group to get it
code = sup.wait(30)
time.sleep(0.5)
print(json.dumps({"code": code, "ranks": {pid: state(pid) for pid in ranks}, "zombies": zombies()}))
"""

REAPER = """
from node_agent import childproc
stop = threading.Event()
childproc.start_reaper(stop, interval_s=0.005)  # as eager as possible, to meet run_child's own waits
env = childproc.child_env()
codes = []
for _ in range(15):
    for script in ("import sys; sys.exit(7)", "import os; os.kill(os.getpid(), 11)"):
        codes.append(childproc.run_child([sys.executable, "-c", script], env=env, timeout_s=30).returncode)
# an orphan in another session: outlives its parent, exits later, and is re-parented to us
orphan = "import subprocess, sys; subprocess.Popen(['sleep', '0.3'], start_new_session=True)"
childproc.run_child([sys.executable, "-c", orphan], env=env, timeout_s=30)
# a timed-out group: leader and a grandchild both die on SIGTERM; the grace period is not waited out
hung = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
start = time.monotonic()
timed = childproc.run_child([sys.executable, "-c", hung], env=env, timeout_s=0.5, kill_grace_s=20)
elapsed = time.monotonic() - start
time.sleep(1.0)
print(json.dumps({"codes": codes, "timed_out": timed.timed_out, "elapsed": elapsed, "zombies": zombies()}))
"""


def _run(script: str, *args: str) -> dict[str, Any]:
    env = childproc.child_env()
    proc = subprocess.run(
        [sys.executable, "-c", SUBREAPER + script, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_stopped_supervisor_reaps_its_ranks(tmp_path: Path) -> None:
    result = _run(SUPERVISOR_STOP, str(tmp_path))
    assert result["code"] == 128 + 15
    assert result["ranks"] and set(result["ranks"].values()) == {"gone"}, f"ranks left behind: {result['ranks']}"
    assert result["zombies"] == []


def test_reaper_collects_orphans_and_keeps_the_exit_status_of_own_children() -> None:
    result = _run(REAPER)
    assert result["codes"] == [7, -11] * 15, "a status collected by the reaper reaches run_child"
    assert result["timed_out"] is True
    assert result["elapsed"] < 10, "the killed group was not kept alive by zombies for the whole grace period"
    assert result["zombies"] == [], "exited orphans were reaped"
