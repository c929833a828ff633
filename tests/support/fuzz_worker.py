"""Runs fuzz cases (fuzz_cases.py) in this process, one JSON line per event
on stdout, so that a parent (``run_batch``) sees which case was running when
a crash or hang ended the process.

    python tests/support/fuzz_worker.py CASES.jsonl     # worker: one case per line
    python tests/support/fuzz_worker.py --replay JSON   # one case, verbose, in this process

Worker protocol: ``{"start": i}`` before case i, then ``{"done": i,
"verdict": ...}`` or ``{"done": i, "failure": ...}``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

# A subprocess entry point: tests/ on the path, as pytest's pythonpath puts it.
TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def worker(path: str) -> None:
    from support import fuzz_cases
    with open(path) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    for i, case in enumerate(cases):
        _emit({"start": i})
        if case.get("op") == "selftest-crash":  # the harness's own test (test_fuzz.py)
            os.abort()
        if case.get("op") == "selftest-hang":
            time.sleep(3600)
        try:
            _emit({"done": i, "verdict": fuzz_cases.run_case(case)})
        except Exception as e:  # noqa: BLE001 -- every failure is reported, the run goes on
            msg = f"{type(e).__name__}: {e}"
            if not isinstance(e, AssertionError):
                msg += "\n" + traceback.format_exc(limit=6)
            _emit({"done": i, "failure": msg[:4000]})


def replay_command(case: dict) -> str:
    return f"python tests/support/fuzz_worker.py --replay '{json.dumps(case)}'"


def run_batch(cases: list[dict], workdir: Path, case_timeout: float = 60.0) -> tuple[list[dict], dict]:
    """Runs ``cases`` in worker subprocesses; a crash or a case running past
    ``case_timeout`` seconds ends that worker, is reported as that case's
    failure, and a new worker takes the remaining cases. Returns (failures,
    verdict counts); each failure holds the case, what happened and the
    replay command."""
    failures: list[dict] = []
    counts: dict[str, int] = {}
    todo = list(cases)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    n = 0
    while todo:
        path = workdir / f"fuzz-batch-{n}.jsonl"
        n += 1
        path.write_text("".join(json.dumps(c) + "\n" for c in todo))
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=str(TESTS_DIR.parent))
        lines: queue.Queue = queue.Queue()
        err_tail: list[str] = []

        # This worker's pipes and queue bound now: a killed worker's reader
        # still ends after the next worker started, and must not tell that
        # one's queue it ended.
        def read_out(proc=proc, lines=lines):
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        def read_err(proc=proc, err_tail=err_tail):
            for line in proc.stderr:
                err_tail.append(line)
                del err_tail[:-40]

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
        running, finished = None, 0
        deadline = time.monotonic() + 120  # start-up (imports) included
        while True:
            try:
                line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                line = "timeout"
            if line == "timeout":
                proc.kill()
                proc.wait()
                i = running if running is not None else finished
                case = todo[i]
                failures.append({"case": case, "what": f"timeout: still running after {case_timeout:.0f} s",
                                 "replay": replay_command(case)})
                counts["timeout"] = counts.get("timeout", 0) + 1
                todo = todo[i + 1:]
                break
            if line is None:  # the worker ended
                proc.wait()
                if running is not None:
                    case = todo[running]
                    failures.append({"case": case, "what": f"crash: worker exited with {proc.returncode}\n"
                                     + "".join(err_tail[-25:]), "replay": replay_command(case)})
                    counts["crash"] = counts.get("crash", 0) + 1
                    todo = todo[running + 1:]
                else:
                    todo = todo[finished:]
                    if todo:  # ended between cases without finishing: report the next one
                        failures.append({"case": todo[0], "what": f"worker exited with {proc.returncode}",
                                         "replay": replay_command(todo[0])})
                        todo = todo[1:]
                break
            ev = json.loads(line)
            if "start" in ev:
                running, deadline = ev["start"], time.monotonic() + case_timeout
            else:
                running, deadline = None, time.monotonic() + case_timeout
                finished = ev["done"] + 1
                if "failure" in ev:
                    case = todo[ev["done"]]
                    failures.append({"case": case, "what": ev["failure"], "replay": replay_command(case)})
                    counts["fail"] = counts.get("fail", 0) + 1
                else:
                    key = ev["verdict"].split(":")[0]
                    counts[key] = counts.get(key, 0) + 1
    return failures, counts


def format_failures(failures: list[dict], limit: int = 10) -> str:
    """Every failure's replay command; the first ``limit`` with the details."""
    out = ["replay commands:"] + [f"  {f['replay']}" for f in failures] + [""]
    for f in failures[:limit]:
        out.append(f"{f['what']}\n  replay: {f['replay']}")
    if len(failures) > limit:
        out.append(f"... and {len(failures) - limit} more")
    return "\n\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--replay":
        from support import fuzz_cases
        case = json.loads(sys.argv[2])
        print(json.dumps(case, indent=1))
        print("verdict:", fuzz_cases.run_case(case))
    elif len(sys.argv) == 2:
        worker(sys.argv[1])
    else:
        sys.exit(__doc__)
