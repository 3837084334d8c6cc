"""``bundle-import fleet-report``: the receipts of many hosts joined into one verdict.

Input: import, check-only and qualification receipts (importer/receipts/receipt.py,
importer/smoke/receipt.py; also the one document ``bundle-import BUNDLE --smoke --json`` prints),
as files or folders of ``*.json`` files, each with an optional ``RECEIPT.sig``
(importer/verify/receiptsig.py). Each receipt names its host (``host.hostname``).

Per host, the newest receipt counts (by ``created``, then path) of each group: the image proof
(an import or check-only receipt: the newer of the two replaces the older) and one qualification
per image qualified (``image.ref``, or this Python with ``--no-container``); older ones are
listed as superseded. A host passes when every receipt that counts passed (import/check-only
result ``pass``, qualification verdict ``pass``), it has the receipts ``require`` asks for (by
default an image proof; ``smoke``: a qualification too), the image a qualification ran is one the
proof showed held, its bundle digest and each image's manifest digest agree with the other hosts
(the value most hosts have is the fleet's; a tie: every host of it disagrees), it is in the list
of expected hosts when one is given, and, with trusted keys, every receipt that counts is signed
by one of them. Hosts of the list with no receipt are ``missing``. A file that is not a receipt
is a problem of the report. The report passes when every host passed and it has no problem.

The document: ``schemas/cli/fleet-report.schema.json``."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from importer import __version__
from importer.errors import FileAccessError, UsageError, os_error_text
from importer.format.text import printable
from importer.receipts.receipt import now_utc
from importer.verify.receiptsig import (
    MAX_SIGNATURE_FILE,
    NOT_CHECKED,
    UNSIGNED,
    VERIFIED,
    ReceiptSignature,
    check_receipt_signature,
    signature_path,
)
from importer.verify.signature import TrustedKey

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: isdigit() also takes superscripts, int() other scripts' digits

REPORT_VERSION = "1.0"
MAX_RECEIPT = 32 * 1024 * 1024
PROOF_KINDS = ("import", "check-only")
KINDS = (*PROOF_KINDS, "qualification")
REQUIREMENTS = ("image", "smoke")
GATES = ("host", "compat", "torch", "matmul", "compile", "optimizer", "allreduce", "shutdown", "restart")
_WORST = {"FAIL": 4, "SKIP": 3, "WARN": 2, "PASS": 1}
MAX_FILES = 100000


# ============================================================================ reading


@dataclass
class Receipt:
    path: str
    doc: Dict[str, Any]
    kind: str
    host: str
    created: str
    signature: ReceiptSignature
    part: str = ""  # "import" / "qualification N" of a combined --smoke --json document

    @property
    def where(self) -> str:
        return f"{self.path} ({self.part})" if self.part else self.path

    def signature_dict(self) -> Dict[str, Any]:
        return self.signature.to_dict()


def receipt_files(paths: Sequence[str]) -> List[str]:
    """Every file named, and every ``*.json`` file below every folder named (sorted, links not
    followed into folders). A path that names nothing is a usage error before anything is read."""
    files: List[str] = []
    for given in paths:
        if os.path.isdir(given):
            for top, dirs, names in os.walk(given):
                dirs.sort()
                files += [os.path.join(top, n) for n in sorted(names) if n.endswith(".json")]
        elif os.path.isfile(given):
            files.append(given)
        else:
            raise FileAccessError(f"reading receipts from {given}: expected a receipt file or a folder of them, "
                                  "found nothing there", hint="check the path (receipts are *.json files)")
        if len(files) > MAX_FILES:
            raise UsageError(f"reading receipts: expected at most {MAX_FILES} files, found more",
                             hint="name the folders of the receipts only")
    unique: Dict[str, str] = {}  # a file named twice (a folder and a file in it) is read once
    for f in files:
        unique.setdefault(os.path.realpath(f), f)
    return list(unique.values())


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def _dict(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _problem(path: str, pid: str, message: str) -> Dict[str, str]:
    return {"path": path, "id": pid, "message": message}


def load_receipts(files: Iterable[str], keys: Sequence[TrustedKey]) -> Tuple[List[Receipt], List[Dict[str, str]]]:
    """The receipts of ``files`` with their signatures judged; and the problems (files that cannot
    be read or are not receipts)."""
    receipts: List[Receipt] = []
    problems: List[Dict[str, str]] = []
    for path in files:
        try:
            raw = _read(path, MAX_RECEIPT)
            doc = json.loads(raw.decode("utf-8"))
        except OSError as e:
            problems.append(_problem(path, "unreadable", f"cannot be read: {os_error_text(e)}"))
            continue
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            problems.append(_problem(path, "not-a-receipt", f"not JSON ({str(e)[:120]})"))
            continue
        sig_file = signature_path(path)
        raw_sig: Optional[bytes] = None
        if os.path.isfile(sig_file):
            try:
                raw_sig = _read(sig_file, MAX_SIGNATURE_FILE)
            except (OSError, ValueError) as e:
                raw_sig = b"unreadable: " + str(e).encode()
        signature = check_receipt_signature(raw, raw_sig, keys)
        parts = _parts(doc)
        if not parts:
            problems.append(_problem(path, "not-a-receipt",
                                     "not a sneakernet receipt (a JSON object with kind import, check-only or "
                                     "qualification)"))
            continue
        for part, sub in parts:
            host = sub.get("host") if isinstance(sub.get("host"), dict) else {}
            name = host.get("hostname") if isinstance(host, dict) else None
            if not isinstance(name, str) or not name:
                problems.append(_problem(path, "no-host", f"the {sub.get('kind')} receipt names no host.hostname"))
                continue
            created = sub.get("created") if isinstance(sub.get("created"), str) else ""
            receipts.append(Receipt(path, sub, str(sub["kind"]), name, str(created), signature, part))
    return receipts, problems


def _parts(doc: Any) -> List[Tuple[str, Dict[str, Any]]]:
    """A receipt is one part; ``--smoke --json`` prints an import receipt and its qualifications."""
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") in KINDS:
        return [("", doc)]
    imp, quals = doc.get("import"), doc.get("qualifications")
    if isinstance(imp, dict) and imp.get("kind") in PROOF_KINDS and isinstance(quals, list):
        parts = [("import", imp)]
        parts += [(f"qualification {n}", q) for n, q in enumerate(quals, 1)
                  if isinstance(q, dict) and q.get("kind") == "qualification"]
        return parts
    return []


# ============================================================================ host lists

_RANGE = re.compile(r"^([^\[\]]*)\[([^\[\]]+)\](.*)$")


def expand_hostlist(text: str) -> List[str]:
    """``node[01-03,07],gpu-a`` -> node01 node02 node03 node07 gpu-a (the Slurm hostlist form;
    leading zeros kept; several bracket groups multiply)."""
    out: List[str] = []
    depth, start = 0, 0
    items: List[str] = []
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for item in (x.strip() for x in items):
        if item:
            out += _expand_one(item)
    return out


def _expand_one(item: str) -> List[str]:
    m = _RANGE.match(item)
    if m is None:
        if "[" in item or "]" in item:
            raise UsageError(f"reading the host list: expected NAME or NAME[01-16,20], found {item!r}")
        return [item]
    head, spec, tail = m.groups()
    names: List[str] = []
    for piece in spec.split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not _DIGITS.fullmatch(lo) or (sep and not _DIGITS.fullmatch(hi)):
            raise UsageError(f"reading the host list: expected numbers in {item!r}, found {piece!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first > MAX_FILES:
            raise UsageError(f"reading the host list: expected a range LOW-HIGH in {item!r}, found {piece!r}")
        names += [f"{head}{str(n).zfill(len(lo))}" for n in range(first, last + 1)]
    return [name + rest for name in names for rest in _expand_one(tail)] if tail else names


def read_host_file(path: str) -> List[str]:
    """One host (or hostlist expression) per line; blank lines and ``#`` comments ignored."""
    try:
        text = _read(path, 16 * 1024 * 1024).decode("utf-8")
    except (OSError, ValueError) as e:
        raise FileAccessError(f"reading the expected hosts {path}: expected a text file of host names, found {e}",
                              hint="one host per line, e.g. from `scontrol show hostnames` or `kubectl get nodes "
                              "-o name`") from None
    hosts: List[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            hosts += expand_hostlist(line.replace("node/", "", 1) if line.startswith("node/") else line)
    return hosts


# ============================================================================ the report


@dataclass
class Host:
    name: str
    receipts: List[Receipt] = field(default_factory=list)
    reasons: List[str] = field(default_factory=list)
    verdict: str = "pass"
    proof: Optional[Receipt] = None
    qualifications: List[Receipt] = field(default_factory=list)
    superseded: List[Receipt] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.reasons.append(reason)
        self.verdict = "fail"

    def images(self) -> List[Dict[str, Any]]:
        if self.proof is None:
            return []
        out = []
        for entry in self.proof.doc.get("images") or []:
            if not isinstance(entry, dict):
                continue
            expected, found = _dict(entry.get("expected")), _dict(entry.get("found"))
            refs = [r for r in entry.get("refs") or [] if isinstance(r, str)]
            out.append({"ref": refs[0] if refs else None, "refs": refs,
                        "manifestDigest": expected.get("manifestDigest"),
                        "configDigest": expected.get("configDigest"),
                        "imageId": found.get("imageId") if found else None,
                        "result": entry.get("result")})
        # receipts list images in the order their run met them; one order for every host
        return sorted(out, key=lambda i: (i["ref"] or "", i["manifestDigest"] or ""))


def _newest(receipts: List[Receipt]) -> Receipt:
    return max(receipts, key=lambda r: (r.created, r.path, r.part))


def _qual_key(r: Receipt) -> str:
    image = r.doc.get("image")
    if isinstance(image, dict):
        return str(image.get("ref") or image.get("id") or "?")
    return "(this Python, --no-container)"


def _busbw(q: Dict[str, Any]) -> Tuple[Optional[float], Optional[int]]:
    """(busbwGBps, bytes) of the all-reduce gate's largest message size; (None, None) without one."""
    for gate in q.get("gates") or []:
        if isinstance(gate, dict) and gate.get("name") == "allreduce" and isinstance(gate.get("metrics"), dict):
            sizes = [s for s in gate["metrics"].get("sizes") or [] if isinstance(s, dict)
                     and isinstance(s.get("busbwGBps"), (int, float)) and isinstance(s.get("bytes"), int)]
            if sizes:
                top = max(sizes, key=lambda s: s["bytes"])
                return float(top["busbwGBps"]), int(top["bytes"])
    return None, None


def _gates(q: Dict[str, Any]) -> Dict[str, str]:
    return {str(g["name"]): str(g.get("status")) for g in q.get("gates") or []
            if isinstance(g, dict) and isinstance(g.get("name"), str)}


def _match_host(name: str, expected: Sequence[str]) -> Optional[str]:
    """The expected host ``name`` is: the same name, else the same short name (before the first dot)."""
    if name in expected:
        return name
    short = name.split(".", 1)[0]
    hits = [e for e in expected if e.split(".", 1)[0] == short]
    return hits[0] if len(hits) == 1 else None


def build_report(receipts: List[Receipt], problems: List[Dict[str, str]], *,
                 expected: Optional[Sequence[str]] = None, require: Sequence[str] = ("image",),
                 keys: Sequence[TrustedKey] = ()) -> Dict[str, Any]:
    """The fleet report document (``ok`` true exactly when every host passed and no problem)."""
    hosts: Dict[str, Host] = {}
    unexpected: List[str] = []
    for r in receipts:
        name = r.host
        if expected is not None:
            matched = _match_host(name, expected)
            if matched is None and name not in unexpected:
                unexpected.append(name)
            name = matched or name
        hosts.setdefault(name, Host(name)).receipts.append(r)
    missing = [h for h in (expected or []) if h not in hosts]
    for h in missing:
        hosts[h] = Host(h, verdict="missing", reasons=["no receipt from this host"])

    for host in hosts.values():
        if host.verdict == "missing":
            continue
        _judge_host(host, require, keys, unexpected)
    disagreements = _disagreements(hosts)
    for d in disagreements:
        for digest, names in d["values"].items():
            if digest == d["fleet"]:
                continue
            for name in names:
                others = f"{d['fleet']} on most hosts" if d["fleet"] else "hosts disagree, no majority"
                hosts[name].fail(f"{d['what']} is {digest} here ({others})")
    ordered = [hosts[n] for n in sorted(hosts)]
    passed = sum(1 for h in ordered if h.verdict == "pass")
    ok = bool(ordered) and passed == len(ordered) and not problems
    return {
        "ok": ok,
        "kind": "fleet-report",
        "reportVersion": REPORT_VERSION,
        "tool": {"name": "sneakernet", "version": __version__},
        "created": now_utc(),
        "verdict": "pass" if ok else "fail",
        "require": list(require),
        "trust": {"keys": [k.fingerprint for k in keys], "signaturesRequired": bool(keys)},
        "expectedHosts": list(expected) if expected is not None else None,
        "counts": {"hosts": len(ordered), "passed": passed,
                   "failed": sum(1 for h in ordered if h.verdict == "fail"),
                   "candidate": sum(1 for h in ordered if h.verdict == "candidate"),
                   "missing": len(missing), "receipts": len(receipts), "problems": len(problems)},
        "hosts": [_host_dict(h) for h in ordered],
        "missingHosts": missing,
        "unexpectedHosts": unexpected,
        "disagreements": disagreements,
        "problems": problems,
    }


def _judge_host(host: Host, require: Sequence[str], keys: Sequence[TrustedKey], unexpected: List[str]) -> None:
    proofs = [r for r in host.receipts if r.kind in PROOF_KINDS]
    quals = [r for r in host.receipts if r.kind == "qualification"]
    if proofs:
        host.proof = _newest(proofs)
    by_image: Dict[str, List[Receipt]] = {}
    for q in quals:
        by_image.setdefault(_qual_key(q), []).append(q)
    host.qualifications = [_newest(v) for _, v in sorted(by_image.items())]
    counted = ([host.proof] if host.proof else []) + host.qualifications
    host.superseded = [r for r in host.receipts if all(r is not c for c in counted)]

    if host.name in unexpected:
        host.fail("not in the expected hosts")
    if host.proof is None:
        if "image" in require:
            host.fail("no import or check-only receipt (nothing proves this host holds the image)")
    else:
        doc = host.proof.doc
        if doc.get("result") != "pass":
            err = _dict(doc.get("error"))
            host.fail(f"{host.proof.kind} failed: error[{err.get('id', '?')}] {str(err.get('message', ''))[:200]}")
        verification = doc.get("verification")
        if not (isinstance(verification, dict) and verification.get("ok") is True) and doc.get("result") == "pass":
            host.fail(f"{host.proof.kind} receipt shows no passed verification")
    if not host.qualifications and "smoke" in require:
        host.fail("no qualification receipt (bundle-import smoke)")
    held = {i["imageId"] for i in host.images() if i["imageId"] and i["result"] == "match"}
    bundle = host.proof.doc.get("bundle") if host.proof else None
    bundle_digest = bundle.get("digest") if isinstance(bundle, dict) else None
    candidate = False
    for q in host.qualifications:
        verdict = q.doc.get("verdict")
        if verdict == "candidate":
            candidate = True
        elif verdict != "pass":
            failed = [g for g, s in _gates(q.doc).items() if s == "FAIL"]
            host.fail(f"qualification of {_qual_key(q)}: verdict {verdict}"
                      + (f" (failed: {', '.join(failed)})" if failed else ""))
        image = q.doc.get("image")
        if isinstance(image, dict) and host.proof is not None and image.get("id") not in held:
            host.fail(f"qualification ran image {str(image.get('id'))[:19]} ({_qual_key(q)}), which the "
                      f"{host.proof.kind} receipt does not show held")
        qb = q.doc.get("bundle")
        if isinstance(qb, dict) and qb.get("digest") and bundle_digest and qb.get("digest") != bundle_digest:
            host.fail(f"qualification of {_qual_key(q)} names bundle {qb.get('digest')}, the "
                      f"{host.proof.kind if host.proof else 'proof'} receipt {bundle_digest}")
    for r in counted:
        sig = r.signature
        allowed = (VERIFIED,) if keys else (UNSIGNED, NOT_CHECKED, VERIFIED)  # without --trust: no bad one
        if sig.status not in allowed:
            host.fail(f"{r.kind} receipt {r.where}: signature {sig.status} ({sig.detail})")
    if candidate and host.verdict == "pass":
        host.verdict = "candidate"
        host.reasons.append("a qualification is only a candidate (a required gate was skipped)")


def _disagreements(hosts: Dict[str, Host]) -> List[Dict[str, Any]]:
    """The bundle digest and each image's manifest digest (by ref) over the hosts that show one:
    more than one value is a disagreement; the value most hosts have is the fleet's."""
    values: Dict[str, Dict[str, List[str]]] = {}
    for host in hosts.values():
        if host.proof is None:
            continue
        bundle = host.proof.doc.get("bundle")
        digest = bundle.get("digest") if isinstance(bundle, dict) else None
        if isinstance(digest, str):
            values.setdefault("bundle", {}).setdefault(digest, []).append(host.name)
        for image in host.images():
            if image["ref"] and isinstance(image["manifestDigest"], str):
                values.setdefault(f"image {image['ref']}", {}).setdefault(image["manifestDigest"], []).append(host.name)
    out = []
    for what, by_digest in sorted(values.items()):
        if len(by_digest) < 2:
            continue
        counts = Counter({d: len(h) for d, h in by_digest.items()}).most_common()
        fleet = counts[0][0] if counts[0][1] > counts[1][1] else None
        out.append({"what": what, "fleet": fleet, "values": {d: sorted(h) for d, h in sorted(by_digest.items())}})
    return out


def _host_dict(h: Host) -> Dict[str, Any]:
    proof = h.proof
    engine = None
    source = proof.doc.get("engine") if proof else None
    if not isinstance(source, dict):
        source = next((q.doc.get("engine") for q in h.qualifications if isinstance(q.doc.get("engine"), dict)), None)
    if isinstance(source, dict):
        engine = {"kind": source.get("kind"), "address": source.get("address"),
                  "imageStore": source.get("imageStore")}
    verification = proof.doc.get("verification") if proof else None
    bundle = proof.doc.get("bundle") if proof else None
    quals: List[Dict[str, Any]] = []
    for q in h.qualifications:
        busbw, size = _busbw(q.doc)
        image = q.doc.get("image") if isinstance(q.doc.get("image"), dict) else None
        quals.append({"path": q.where, "created": q.created, "image": _qual_key(q),
                      "imageId": image.get("id") if image else None, "verdict": q.doc.get("verdict"),
                      "device": q.doc.get("device"), "gates": _gates(q.doc), "busbwGBps": busbw,
                      "busbwBytes": size, "signature": q.signature_dict()})
    return {
        "hostname": h.name,
        "verdict": h.verdict,
        "reasons": h.reasons,
        "engine": engine,
        "bundleDigest": bundle.get("digest") if isinstance(bundle, dict) else None,
        "images": h.images(),
        "verification": None if not isinstance(verification, dict) else bool(verification.get("ok")),
        "proof": None if proof is None else {
            "kind": proof.kind, "path": proof.where, "created": proof.created, "result": proof.doc.get("result"),
            "errorId": (proof.doc.get("error") or {}).get("id") if isinstance(proof.doc.get("error"), dict) else None,
            "signature": proof.signature_dict()},
        "qualifications": quals,
        "gates": worst_gates(quals),
        "busbwGBps": min((float(q["busbwGBps"]) for q in quals if q["busbwGBps"] is not None), default=None),
        "superseded": [r.where for r in h.superseded],
    }


def worst_gates(quals: List[Dict[str, Any]]) -> Dict[str, str]:
    """Each gate's worst status over the host's qualifications (FAIL > SKIP > WARN > PASS)."""
    out: Dict[str, str] = {}
    for q in quals:
        for name, status in q["gates"].items():
            if name not in out or _WORST.get(status, 5) > _WORST.get(out[name], 5):
                out[name] = status
    return out


# ============================================================================ the table


def render_table(report: Dict[str, Any]) -> str:
    """HOST ENGINE IMAGE VERIFY <gates...> BUSBW VERDICT, then one line per reason and problem."""
    gates = [g for g in GATES if any(g in h["gates"] for h in report["hosts"])]
    short = {"optimizer": "optim", "allreduce": "allred", "shutdown": "shutdn", "restart": "restrt"}
    rows = [("HOST", "ENGINE", "IMAGE", "VERIFY", *[short.get(g, g) for g in gates], "BUSBW", "VERDICT")]
    for h in report["hosts"]:
        images = [i["manifestDigest"] for i in h["images"] if i["manifestDigest"]]
        image = (images[0][:19] + (f" +{len(images) - 1}" if len(images) > 1 else "")) if images else "-"
        verify = "-" if h["verification"] is None else "ok" if h["verification"] else "FAIL"
        engine = (h["engine"] or {}).get("kind") or "-"
        busbw = f"{h['busbwGBps']:.2f}GB/s" if h["busbwGBps"] is not None else "-"
        rows.append(tuple(printable(str(c)) for c in (  # every cell quotes a receipt: escaped (docs/security.md)
            h["hostname"], engine, image, verify, *[h["gates"].get(g, "-") for g in gates], busbw,
            str(h["verdict"]).upper())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for h in report["hosts"]:
        lines += [f"{h['hostname']}: {reason}" for reason in h["reasons"] if h["verdict"] != "pass"]
    lines += [f"problem [{p['id']}] {p['path']}: {p['message']}" for p in report["problems"]]
    c = report["counts"]
    lines.append(f"fleet: {report['verdict']}: {c['passed']}/{c['hosts']} host(s) passed"
                 + (f", {c['missing']} missing" if c["missing"] else "")
                 + (f", {c['problems']} problem(s)" if c["problems"] else "")
                 + f" ({c['receipts']} receipt(s))")
    return "\n".join(printable(line) for line in lines)
