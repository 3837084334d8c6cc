"""From the suite's protocol lines to one result per gate, and from the gates to the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

from importer.smoke.worker.protocol import FAIL, GATES, PASS, SKIP, WARN, result

#: Gates the suite itself reports (everything but host and restart), in order.
SUITE_GATES = ("compat", "torch", "matmul", "compile", "optimizer", "allreduce", "shutdown")
REQUIRED = {
    "cuda": {"host", "compat", "torch", "matmul", "compile", "optimizer", "allreduce", "shutdown"},
    "cpu": {"torch", "matmul", "compile", "optimizer", "allreduce", "shutdown"},
}
#: Exit codes of the verdicts: 10 for candidate, its own code (2 is a configuration error,
#: docs/errors.md); the codes 3-9 belong to the import.
EXIT_CANDIDATE = 10
#: a gate failed: a code of its own (docs/errors.md), so that exit 1 means only "a bug"
EXIT_GATE_FAILED = 11
EXIT_CODES = {"pass": 0, "fail": EXIT_GATE_FAILED, "candidate": EXIT_CANDIDATE}


def required_gates(device: str, restart: bool) -> Set[str]:
    req = set(REQUIRED[device])
    if restart:
        req.add("restart")
    return req


@dataclass
class RunOutcome:
    """One run of the suite: its protocol events and how the process ended."""

    events: List[Dict[str, Any]] = field(default_factory=list)
    returncode: Optional[int] = None
    timed_out: bool = False
    stderr_tail: str = ""
    seconds: float = 0.0
    failure: Optional[str] = None  # why the suite did not report "done"

    @property
    def done(self) -> bool:
        return any(ev.get("event") == "done" for ev in self.events)

    def first(self, kind: str) -> Optional[Dict[str, Any]]:
        return next((ev for ev in self.events if ev.get("event") == kind), None)

    def to_dict(self) -> Dict[str, Any]:
        return {"exitCode": self.returncode, "timedOut": self.timed_out, "completed": self.done,
                "seconds": round(self.seconds, 3), "failure": self.failure, "stderrTail": self.stderr_tail}


def _clean(ev: Dict[str, Any]) -> Dict[str, Any]:
    out = {"name": ev.get("gate"), "status": ev.get("status") if ev.get("status") in (PASS, FAIL, SKIP, WARN) else FAIL,
           "seconds": float(ev.get("seconds") or 0.0), "metrics": ev.get("metrics") or {},
           "error": ev.get("error"), "detail": ev.get("detail") or ""}
    return out


def suite_gates(outcome: RunOutcome) -> Dict[str, Dict[str, Any]]:
    """One result per suite gate. Gates a dead or killed suite never reported: FAIL when they
    had started, else SKIP "not run"; and if that leaves no FAIL at all, torch FAILs with the
    reason (an image without python or torch never gets as far as a gate)."""
    found: Dict[str, Dict[str, Any]] = {}
    started: Set[str] = set()
    for ev in outcome.events:
        kind = ev.get("event")
        if kind == "result" and ev.get("gate") in SUITE_GATES:
            found[str(ev["gate"])] = _clean(ev)
        elif kind == "start":
            started.add(str(ev.get("gate")))
    if outcome.done:
        for g in SUITE_GATES:
            if g not in found:
                found[g] = _clean(result(g, FAIL, 0.0, None, "the suite reported no result for this gate"))
        return found
    reason = outcome.failure or "the suite ended without reporting every gate"
    decided = outcome.first("compat-decided")
    if "compat" not in found and decided is not None:
        found["compat"] = _clean(result("compat", str(decided.get("status")), 0.0,
                                        {k: v for k, v in decided.items() if k != "event"},
                                        decided.get("reason") if decided.get("status") == FAIL else None,
                                        str(decided.get("reason") or "")))
    for g in SUITE_GATES:
        if g in found:
            continue
        if g in started:
            found[g] = _clean(result(g, FAIL, 0.0, None, f"{reason} while this gate ran"))
        else:
            found[g] = _clean(result(g, SKIP, 0.0, None, None, f"not run: {reason}"))
    if not any(r["status"] == FAIL for r in found.values()):
        found["torch"] = _clean(result("torch", FAIL, 0.0, None, reason))
    return found


def order(gates: Dict[str, Dict[str, Any]], required: Set[str]) -> List[Dict[str, Any]]:
    out = []
    for name in GATES:
        if name in gates:
            out.append(dict(gates[name], name=name, required=name in required))
    return out


def verdict(gates: List[Dict[str, Any]]) -> str:
    """fail if any gate failed; candidate while a required gate is skipped or missing; else pass."""
    if any(g["status"] == FAIL for g in gates):
        return "fail"
    if any(g["required"] and g["status"] not in (PASS, WARN) for g in gates):
        return "candidate"
    return "pass"


def restart_gate(mode: str, second: Optional[RunOutcome], restart_seconds: Optional[float],
                 error: Optional[str]) -> Dict[str, Any]:
    """The restart gate: the restart itself worked and the second run failed no gate."""
    metrics: Dict[str, Any] = {"mode": mode, "restartSeconds": restart_seconds}
    problems = [error] if error else []
    seconds = (restart_seconds or 0.0) + (second.seconds if second else 0.0)
    if second is not None:
        again = suite_gates(second)
        metrics["secondRun"] = {g: again[g]["status"] for g in SUITE_GATES}
        bad = [f"{g}: {again[g]['error']}" for g in SUITE_GATES if again[g]["status"] == FAIL]
        if bad:
            problems.append("after the restart " + "; ".join(bad))
    elif not problems:
        problems.append("the second run did not happen")
    if problems:
        return _clean(result("restart", FAIL, seconds, metrics, "; ".join(problems)))
    return _clean(result("restart", PASS, seconds, metrics, None,
                         "the suite passed again after " + ("docker restart" if mode == "container"
                                                           else "a fresh interpreter")))
