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

import datetime
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from importer import __version__
from importer.errors import FileAccessError, ManifestError, UsageError, os_error_text
from importer.format.digest import is_digest
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

REPORT_VERSION = "1.1"
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


# ============================================================================ the bundles the fleet must hold

_RFC3339 = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                      r"([Zz]|[+-][0-9]{2}:[0-9]{2})$")


def parse_time(text: Any) -> Optional[datetime.datetime]:
    """An RFC 3339 time (``2024-05-01T12:00:00Z``, an offset, fractions of a second) as an aware
    datetime; None for anything else (ASCII digits only)."""
    m = _RFC3339.match(text) if isinstance(text, str) else None
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(x) for x in m.groups()[:6])
    zone = m.group(8)
    if zone in ("Z", "z"):
        tz = datetime.timezone.utc
    else:
        sign = -1 if zone[0] == "-" else 1
        tz = datetime.timezone(sign * datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        return datetime.datetime(year, month, day, hour, minute, min(second, 59), tzinfo=tz)
    except ValueError:
        return None


@dataclass
class ExpectedBundle:
    """A bundle every host must hold: ``--bundle BUNDLE`` (its digest, ``created`` and images) or
    ``--expect-digest`` (the digest only: receipts must name it, no time is judged)."""

    digest: str
    created: Optional[str] = None
    path: Optional[str] = None
    images: Tuple[str, ...] = ()  # config and manifest digests of its images (what an engine may call the image)

    @property
    def time(self) -> Optional[datetime.datetime]:
        return parse_time(self.created)

    def to_dict(self) -> Dict[str, Any]:
        return {"digest": self.digest, "created": self.created, "path": self.path,
                "source": "bundle" if self.path is not None else "expect-digest"}


def expected_digest(text: str) -> ExpectedBundle:
    """``--expect-digest sha256:...``; a usage error for anything else."""
    if not is_digest(text):
        raise UsageError(f"reading --expect-digest: expected sha256: and 64 lowercase hex digits (a bundle.json "
                         f"digest, as receipts record it), found {text[:100]!r}",
                         hint="the digest is sha256sum of bundle.json, or bundle.digest of an import receipt")
    return ExpectedBundle(text)


def expected_bundle(path: str) -> ExpectedBundle:
    """``--bundle BUNDLE`` (a folder, tar or parts index): the digest of its bundle.json (what
    receipts record), its ``created`` time and its images' digests. Only bundle.json is read."""
    from importer.input.opened import open_bundle

    opened = open_bundle(path)
    doc = opened.document()
    created = doc.get("created") if isinstance(doc, dict) else None
    if parse_time(created) is None:
        shown = printable(str(created))[:80] if created is not None else "none"
        raise ManifestError(f"reading --bundle {path}: expected bundle.json's created as an RFC 3339 time "
                            f"(2024-05-01T12:00:00Z), found {shown}",
                            hint="pass --expect-digest " + str(opened.digest) + " instead: receipts must name the "
                            "digest, no time is judged")
    images: List[str] = []
    for image in (doc.get("images") if isinstance(doc.get("images"), list) else []):
        for record in [image, *(image.get("platforms") or [] if isinstance(image, dict)
                                and isinstance(image.get("platforms"), list) else [])]:
            if not isinstance(record, dict):
                continue
            for key in ("config", "manifest"):
                digest = _dict(record.get(key)).get("digest")
                if is_digest(digest):
                    images.append(str(digest))
    return ExpectedBundle(str(opened.digest), str(created), opened.path, tuple(dict.fromkeys(images)))


# ============================================================================ the report


@dataclass
class Host:
    """One row: a host and one engine of it (``engine`` None: receipts that name no engine, on a
    host none of whose receipts do)."""

    name: str
    engine: Optional[str] = None
    receipts: List[Receipt] = field(default_factory=list)
    reasons: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    verdict: str = "pass"
    proof: Optional[Receipt] = None
    proofs: List[Receipt] = field(default_factory=list)  # the proofs that count: one per bundle named
    qualifications: List[Receipt] = field(default_factory=list)
    superseded: List[Receipt] = field(default_factory=list)
    label: str = ""
    ran: Dict[int, Dict[str, Any]] = field(default_factory=dict)  # id(qualification) -> _ran()

    def fail(self, reason: str) -> None:
        self.reasons.append(reason)
        self.verdict = "fail"

    def stale(self, reason: str) -> None:
        """Not the bundle named, or not newer than it: the rollout did not reach this row."""
        self.reasons.append(reason)
        if self.verdict in ("pass", "candidate"):
            self.verdict = "stale"

    def images(self) -> List[Dict[str, Any]]:
        out = []
        for proof in self.proofs:
            for entry in _list(proof.doc.get("images")):
                if not isinstance(entry, dict):
                    continue
                expected, found = _dict(entry.get("expected")), _dict(entry.get("found"))
                refs = [r for r in _list(entry.get("refs")) if isinstance(r, str)]
                image_id = found.get("imageId")
                out.append({"ref": refs[0] if refs else None, "refs": refs,
                            "manifestDigest": _digest(expected.get("manifestDigest")),
                            "configDigest": _digest(expected.get("configDigest")),
                            "imageId": image_id if isinstance(image_id, str) else None,
                            "result": _enum(entry.get("result"), ("match", "mismatch", "missing"))})
        # receipts list images in the order their run met them; one order for every host
        return sorted(out, key=lambda i: (i["ref"] or "", i["manifestDigest"] or ""))


def _list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def _digest(value: Any) -> Optional[str]:
    return str(value) if is_digest(value) else None


def _enum(value: Any, allowed: Sequence[str]) -> Optional[str]:
    return value if isinstance(value, str) and value in allowed else None


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _newest(receipts: List[Receipt]) -> Receipt:
    return max(receipts, key=lambda r: (r.created, r.path, r.part))


def _qual_key(r: Receipt) -> str:
    image = r.doc.get("image")
    if isinstance(image, dict):
        return str(image.get("ref") or image.get("id") or "?")
    return "(this Python, --no-container)"


def _bundle_of(r: Receipt) -> Optional[str]:
    return _digest(_dict(r.doc.get("bundle")).get("digest"))


def _engine_kind(r: Receipt) -> Optional[str]:
    kind = _dict(r.doc.get("engine")).get("kind")
    return kind if isinstance(kind, str) and kind else None


def _busbw(q: Dict[str, Any]) -> Tuple[Optional[float], Optional[int]]:
    """(busbwGBps, bytes) of the all-reduce gate's largest message size; (None, None) without one."""
    for gate in _list(q.get("gates")):
        if isinstance(gate, dict) and gate.get("name") == "allreduce" and isinstance(gate.get("metrics"), dict):
            sizes = [s for s in _list(gate["metrics"].get("sizes")) if isinstance(s, dict)
                     and _number(s.get("busbwGBps")) and isinstance(s.get("bytes"), int)
                     and not isinstance(s.get("bytes"), bool) and s["bytes"] >= 0]
            if sizes:
                top = max(sizes, key=lambda s: s["bytes"])
                return float(top["busbwGBps"]), int(top["bytes"])
    return None, None


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)


def _gates(q: Dict[str, Any]) -> Dict[str, str]:
    return {str(g["name"]): str(g.get("status")) for g in _list(q.get("gates"))
            if isinstance(g, dict) and isinstance(g.get("name"), str) and g.get("status") in _WORST}


PREDATES = "receipt predates device recording; re-run the smoke"


def _ran(q: Receipt) -> Dict[str, Any]:
    """What a qualification says it qualified: device, where, GPU count and models, the host's
    GPU count; ``problem`` when it does not say it (a receipt before 1.1) or says it wrongly."""
    doc = q.doc
    device, where, gpus = doc.get("device"), doc.get("where"), doc.get("gpus")
    out: Dict[str, Any] = {"device": _enum(device, ("cuda", "cpu")), "where": _enum(where, ("image", "host-python")),
                           "gpuCount": None, "gpuModels": [], "hostGpus": None, "problem": None}
    host_gpus = _dict(doc.get("host")).get("gpus")
    if isinstance(host_gpus, list):
        out["hostGpus"] = len(host_gpus)
    if isinstance(gpus, dict):
        count, models = gpus.get("count"), gpus.get("models")
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            out["gpuCount"] = count
        if isinstance(models, list):
            out["gpuModels"] = [m for m in models if isinstance(m, str)]
    if "where" not in doc or "gpus" not in doc or "device" not in doc:
        out["problem"] = PREDATES
    elif out["device"] is None or out["where"] is None or out["gpuCount"] is None or not isinstance(
            gpus.get("models") if isinstance(gpus, dict) else None, list):
        out["problem"] = ("receipt records device, where or gpus in a form bundle-import smoke does not write "
                          f"(device {_shown(device)}, where {_shown(where)}, gpus {_shown(gpus)}); re-run the smoke")
    elif out["where"] == "image" and not isinstance(doc.get("image"), dict):
        out["problem"] = "receipt says the gates ran in an image but names none; re-run the smoke"
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _match_host(name: str, expected: Sequence[str]) -> Optional[str]:
    """The expected host ``name`` is: the same name, else the same short name (before the first dot)."""
    if name in expected:
        return name
    short = name.split(".", 1)[0]
    hits = [e for e in expected if e.split(".", 1)[0] == short]
    return hits[0] if len(hits) == 1 else None


@dataclass(frozen=True)
class Policy:
    """What a host needs (``require``), what is accepted as a qualification, the bundles named."""

    require: Tuple[str, ...] = ("image",)
    allow_cpu: bool = False
    allow_host_python: bool = False
    bundles: Tuple[ExpectedBundle, ...] = ()


def _rows(by_host: Dict[str, List[Receipt]]) -> List[Host]:
    """One row per host and engine kind; receipts that name no engine (this Python, an engine
    never reached) belong to every row of their host, or to the host's one row without engine."""
    rows: List[Host] = []
    for name in sorted(by_host):
        receipts = by_host[name]
        kinds = sorted({k for k in (_engine_kind(r) for r in receipts) if k is not None})
        if not kinds:
            rows.append(Host(name, None, list(receipts), label=name))
            continue
        for kind in kinds:
            mine = [r for r in receipts if _engine_kind(r) in (kind, None)]
            rows.append(Host(name, kind, mine, label=name if len(kinds) == 1 else f"{name} ({kind})"))
    return rows


def build_report(receipts: List[Receipt], problems: List[Dict[str, str]], *,
                 expected: Optional[Sequence[str]] = None, require: Sequence[str] = ("image",),
                 keys: Sequence[TrustedKey] = (), allow_cpu: bool = False, allow_host_python: bool = False,
                 bundles: Sequence[ExpectedBundle] = ()) -> Dict[str, Any]:
    """The fleet report document (``ok`` true exactly when every row passed and no problem)."""
    policy = Policy(tuple(require), allow_cpu, allow_host_python, tuple(bundles))
    by_host: Dict[str, List[Receipt]] = {}
    unexpected: List[str] = []
    for r in receipts:
        name = r.host
        if expected is not None:
            matched = _match_host(name, expected)
            if matched is None and name not in unexpected:
                unexpected.append(name)
            name = matched or name
        by_host.setdefault(name, []).append(r)
    rows = _rows(by_host)
    missing = [h for h in (expected or []) if h not in by_host]
    for row in rows:
        _judge_host(row, policy, keys, unexpected)
    rows += [Host(h, verdict="missing", reasons=["no receipt from this host"], label=h) for h in missing]
    disagreements = _disagreements(rows, by_bundle=not policy.bundles)
    by_label = {row.label: row for row in rows}
    for d in disagreements:
        for digest, names in d["values"].items():
            if digest == d["fleet"]:
                continue
            for name in names:
                others = f"{d['fleet']} on most hosts" if d["fleet"] else "hosts disagree, no majority"
                by_label[name].fail(f"{d['what']} is {digest} here ({others})")
    ordered = sorted(rows, key=lambda h: (h.name, h.engine or ""))
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
        "allow": {"cpu": allow_cpu, "hostPython": allow_host_python},
        "bundles": [b.to_dict() for b in policy.bundles],
        "trust": {"keys": [k.fingerprint for k in keys], "signaturesRequired": bool(keys)},
        "expectedHosts": list(expected) if expected is not None else None,
        "counts": {"hosts": len(ordered), "passed": passed,
                   "failed": sum(1 for h in ordered if h.verdict == "fail"),
                   "candidate": sum(1 for h in ordered if h.verdict == "candidate"),
                   "stale": sum(1 for h in ordered if h.verdict == "stale"),
                   "missing": len(missing), "receipts": len(receipts), "problems": len(problems)},
        "hosts": [_host_dict(h) for h in ordered],
        "missingHosts": missing,
        "unexpectedHosts": unexpected,
        "disagreements": disagreements,
        "problems": problems,
    }


def _not_older(r: Receipt, b: ExpectedBundle) -> bool:
    """``r`` was written at or after the bundle's ``created`` (always, for --expect-digest)."""
    if b.time is None:
        return True
    when = parse_time(r.created)
    return when is not None and when >= b.time


def _pick_proofs(host: Host, proofs: List[Receipt], policy: Policy) -> None:
    """The proofs that count: the newest; with bundles named, the newest naming each one and not
    older than it (a row without one is stale, when ``image`` is required)."""
    if not policy.bundles:
        host.proofs = [_newest(proofs)] if proofs else []
        return
    for b in policy.bundles:
        naming = [r for r in proofs if _bundle_of(r) == b.digest]
        fresh = [r for r in naming if _not_older(r, b)]
        if fresh:
            host.proofs.append(_newest(fresh))
        elif "image" not in policy.require:
            continue
        elif naming:
            host.stale(f"its receipts naming bundle {b.digest} are older than the bundle (created {b.created}; "
                       f"newest {_newest(naming).created or 'undated'}): re-run the import or --check-only")
        elif proofs:
            newest = _newest(proofs)
            host.stale(f"no receipt names bundle {b.digest}: the newest ({newest.kind}, {newest.created or 'undated'})"
                       f" names {_bundle_of(newest) or 'no bundle'}; the rollout has not reached this host")
        else:
            host.stale(f"no import or check-only receipt names bundle {b.digest}")


def _tied(q: Receipt, b: ExpectedBundle, held: Dict[str, Set[str]]) -> bool:
    """The qualification ran an image of bundle ``b``: it names ``b`` (``--smoke``), or ran an
    image a proof of ``b`` shows held, or one of ``b``'s own digests."""
    if _bundle_of(q) == b.digest:
        return True
    image_id = _dict(q.doc.get("image")).get("id")
    if not isinstance(image_id, str) or not image_id:
        return False
    plain = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    return image_id in held.get(b.digest, set()) or plain in b.images


def _judge_host(host: Host, policy: Policy, keys: Sequence[TrustedKey], unexpected: List[str]) -> None:
    require = policy.require
    proofs = [r for r in host.receipts if r.kind in PROOF_KINDS]
    quals = [r for r in host.receipts if r.kind == "qualification"]
    _pick_proofs(host, proofs, policy)
    host.proof = host.proofs[0] if host.proofs else None
    by_image: Dict[str, List[Receipt]] = {}
    for q in quals:
        by_image.setdefault(_qual_key(q), []).append(q)
    host.qualifications = [_newest(v) for _, v in sorted(by_image.items())]
    counted = host.proofs + host.qualifications
    host.superseded = [r for r in host.receipts if all(r is not c for c in counted)]

    if host.name in unexpected:
        host.fail("not in the expected hosts")
    if not host.proofs and "image" in require and not policy.bundles:
        host.fail("no import or check-only receipt (nothing proves this host holds the image)")
    for proof in host.proofs:
        doc = proof.doc
        if doc.get("result") != "pass":
            err = _dict(doc.get("error"))
            host.fail(f"{proof.kind} failed: error[{err.get('id', '?')}] {_long(err.get('message', ''), proof)}")
        verification = doc.get("verification")
        if not (isinstance(verification, dict) and verification.get("ok") is True) and doc.get("result") == "pass":
            host.fail(f"{proof.kind} receipt shows no passed verification")
    held_by: Dict[str, Set[str]] = {}
    for proof in host.proofs:
        digest = _bundle_of(proof) or ""
        for entry in _list(proof.doc.get("images")):
            found = _dict(_dict(entry).get("found"))
            if _dict(entry).get("result") == "match" and isinstance(found.get("imageId"), str):
                held_by.setdefault(digest, set()).add(found["imageId"])
    held: Set[str] = set().union(*held_by.values())
    proof_digests = {d for d in (_bundle_of(p) for p in host.proofs) if d}
    candidate = False
    good: List[Receipt] = []  # qualifications that qualify this host under the policy (or only a candidate's gates)
    whys: List[str] = []
    for q in host.qualifications:
        ran = host.ran[id(q)] = _ran(q)
        verdict = q.doc.get("verdict")
        if verdict == "candidate":
            candidate = True
        elif verdict != "pass":
            failed = [g for g, s in _gates(q.doc).items() if s == "FAIL"]
            host.fail(f"qualification of {_qual_key(q)}: verdict {_shown(verdict)}"
                      + (f" (failed: {', '.join(failed)})" if failed else ""))
        image = q.doc.get("image")
        if isinstance(image, dict) and host.proofs and image.get("id") not in held:
            host.fail(f"qualification ran image {_shown(image.get('id'))} ({_qual_key(q)}), which the "
                      f"{host.proof.kind if host.proof else 'proof'} receipt does not show held")
            ran["why"] = "ran an image the proof does not show held"
            continue
        qb = _bundle_of(q)
        if qb and proof_digests and qb not in proof_digests and not policy.bundles:
            host.fail(f"qualification of {_qual_key(q)} names bundle {qb}, the "
                      f"{host.proof.kind if host.proof else 'proof'} receipt {', '.join(sorted(proof_digests))}")
        why = _why_not(ran, verdict, policy)
        ran["why"] = why
        if why is None or (verdict == "candidate" and _why_not(ran, "pass", policy) is None):
            good.append(q)  # a candidate meets the requirement, and makes the row CANDIDATE (below)
        else:
            whys.append(f"{_qual_key(q)}: {why}")
    if "smoke" in require:
        _require_smoke(host, policy, good, whys, held_by)
    for r in counted:
        sig = r.signature
        allowed = (VERIFIED,) if keys else (UNSIGNED, NOT_CHECKED, VERIFIED)  # without --trust: no bad one
        if sig.status not in allowed:
            host.fail(f"{r.kind} receipt {r.where}: signature {sig.status} ({sig.detail})")
    if candidate and host.verdict == "pass":
        host.verdict = "candidate"
        host.reasons.append("a qualification is only a candidate (a required gate was skipped)")


def _why_not(ran: Dict[str, Any], verdict: Any, policy: Policy) -> Optional[str]:
    """Why a qualification does not qualify the host's GPUs in the bundle's image under
    ``policy``; None when it does."""
    if ran["problem"]:
        return str(ran["problem"])
    if ran["device"] == "cpu" and not policy.allow_cpu:
        return "ran on the CPU (--device cpu), which qualifies no GPU (--allow-cpu accepts CPU runs)"
    if ran["device"] == "cuda" and not ran["gpuCount"]:
        return "ran with --device cuda but the suite saw no GPU"
    if ran["where"] == "host-python" and not policy.allow_host_python:
        return ("ran in this Python (--no-container), not in the bundle's image (--allow-host-python accepts "
                "such runs)")
    if verdict != "pass":
        return f"verdict {_shown(verdict)}"
    return None


def _require_smoke(host: Host, policy: Policy, good: List[Receipt], whys: List[str],
                   held_by: Dict[str, Set[str]]) -> None:
    """``--require smoke``: a qualification that qualifies the GPUs (of each bundle named, not
    older than it); notes for what the operator allowed."""
    if not host.qualifications:
        host.fail("no qualification receipt (bundle-import smoke)")
        return
    if not good:
        host.fail("no qualification qualifies this host's GPUs in the bundle's image: " + "; ".join(whys))
        return
    used: List[Receipt] = []
    for b in policy.bundles:
        mine = [q for q in good if (host.ran[id(q)]["where"] == "host-python" or _tied(q, b, held_by))]
        fresh = [q for q in mine if _not_older(q, b)]
        if fresh:
            used += fresh
        elif mine:
            host.stale(f"its qualifications of bundle {b.digest} are older than the bundle (created {b.created}): "
                       "re-run the smoke")
        else:
            host.stale(f"no qualification ran an image of bundle {b.digest} (qualified: "
                       f"{', '.join(_qual_key(q) for q in good)}); re-run the smoke in the bundle's image")
    for q in (used if policy.bundles else good):
        ran = host.ran[id(q)]
        if ran["device"] == "cpu" and ran["hostGpus"]:
            host.notes.append(f"{_qual_key(q)}: qualified on the CPU (--allow-cpu) although the host has "
                              f"{ran['hostGpus']} GPU(s)")
        elif ran["device"] == "cpu":
            host.notes.append(f"{_qual_key(q)}: qualified on the CPU (--allow-cpu)")
        elif ran["hostGpus"] and ran["gpuCount"] < ran["hostGpus"]:
            host.notes.append(f"{_qual_key(q)}: qualified {ran['gpuCount']} of the host's {ran['hostGpus']} GPUs")
        if ran["where"] == "host-python":
            host.notes.append(f"{_qual_key(q)}: qualified in this Python (--allow-host-python), not in the bundle's "
                              "image")


MAX_REASON = 4096


def _long(value: Any, r: Receipt) -> str:
    """A receipt's message as a reason: whole, unless it is past MAX_REASON characters (then the
    reason says how much more the receipt holds)."""
    text = str(value)
    if len(text) <= MAX_REASON:
        return text
    return f"{text[:MAX_REASON]} [... {len(text) - MAX_REASON} more characters in {r.where}]"


def _disagreements(hosts: List[Host], *, by_bundle: bool = True) -> List[Dict[str, Any]]:
    """The bundle digest (``by_bundle``: when no bundle was named) and each image's manifest
    digest (by ref) over the rows that show one: more than one value is a disagreement; the value
    most rows have is the fleet's."""
    values: Dict[str, Dict[str, List[str]]] = {}
    for host in hosts:
        if host.proof is None:
            continue
        digest = _bundle_of(host.proof)
        if by_bundle and digest is not None:
            values.setdefault("bundle", {}).setdefault(digest, []).append(host.label)
        for image in host.images():
            if image["ref"] and isinstance(image["manifestDigest"], str):
                values.setdefault(f"image {image['ref']}", {}).setdefault(image["manifestDigest"], []).append(
                    host.label)
    out = []
    for what, by_digest in sorted(values.items()):
        if len(by_digest) < 2:
            continue
        counts = Counter({d: len(set(h)) for d, h in by_digest.items()}).most_common()
        fleet = counts[0][0] if counts[0][1] > counts[1][1] else None
        out.append({"what": what, "fleet": fleet,
                    "values": {d: sorted(set(h)) for d, h in sorted(by_digest.items())}})
    return out


def _host_dict(h: Host) -> Dict[str, Any]:
    proof = h.proof
    engine = None
    source = proof.doc.get("engine") if proof else None
    if not isinstance(source, dict):
        source = next((q.doc.get("engine") for q in h.qualifications if isinstance(q.doc.get("engine"), dict)), None)
    if isinstance(source, dict):
        engine = {"kind": _str(source.get("kind")), "address": _str(source.get("address")),
                  "imageStore": _str(source.get("imageStore"))}
    verification = proof.doc.get("verification") if proof else None
    quals: List[Dict[str, Any]] = []
    for q in h.qualifications:
        busbw, size = _busbw(q.doc)
        image = q.doc.get("image") if isinstance(q.doc.get("image"), dict) else None
        ran = h.ran.get(id(q)) or _ran(q)
        quals.append({"path": q.where, "created": q.created, "image": _qual_key(q),
                      "imageId": _str(image.get("id")) if image else None,
                      "verdict": _enum(q.doc.get("verdict"), ("pass", "fail", "candidate")),
                      "device": ran["device"], "where": ran["where"], "gpuCount": ran["gpuCount"],
                      "gpuModels": ran["gpuModels"], "hostGpuCount": ran["hostGpus"],
                      "qualifies": "why" in ran and ran["why"] is None, "why": ran.get("why"),
                      "bundleDigest": _bundle_of(q), "gates": _gates(q.doc), "busbwGBps": busbw,
                      "busbwBytes": size, "signature": q.signature_dict()})
    return {
        "hostname": h.name,
        "row": h.label,
        "verdict": h.verdict,
        "reasons": h.reasons,
        "notes": h.notes,
        "engine": engine,
        "bundleDigest": _bundle_of(proof) if proof else None,
        "bundleDigests": [d for d in dict.fromkeys(_bundle_of(p) for p in h.proofs) if d],
        "images": h.images(),
        "verification": None if not isinstance(verification, dict) else verification.get("ok") is True,
        "proof": None if proof is None else _proof_dict(proof),
        "proofs": [_proof_dict(p) for p in h.proofs],
        "qualifications": quals,
        "gates": worst_gates(quals),
        "busbwGBps": min((float(q["busbwGBps"]) for q in quals if q["busbwGBps"] is not None), default=None),
        "superseded": [r.where for r in h.superseded],
    }


def _proof_dict(proof: Receipt) -> Dict[str, Any]:
    error = proof.doc.get("error")
    return {"kind": proof.kind, "path": proof.where, "created": proof.created,
            "result": _enum(proof.doc.get("result"), ("pass", "fail")), "bundleDigest": _bundle_of(proof),
            "errorId": _str(error.get("id")) if isinstance(error, dict) else None,
            "signature": proof.signature_dict()}


def worst_gates(quals: List[Dict[str, Any]]) -> Dict[str, str]:
    """Each gate's worst status over the host's qualifications (FAIL > SKIP > WARN > PASS)."""
    out: Dict[str, str] = {}
    for q in quals:
        for name, status in q["gates"].items():
            if name not in out or _WORST.get(status, 5) > _WORST.get(out[name], 5):
                out[name] = status
    return out


# ============================================================================ the table


def _device_cell(quals: List[Dict[str, Any]]) -> str:
    """What the counted qualifications ran on: ``cuda:8`` (8 GPUs), ``cpu``, ``?`` (not recorded), joined."""
    cells = []
    for q in quals:
        if q["device"] is None or q["where"] is None:
            cells.append("?")
        elif q["device"] == "cuda":
            cells.append(f"cuda:{q['gpuCount'] or 0}")
        else:
            cells.append("cpu")
    return ",".join(dict.fromkeys(cells)) or "-"


def _where_cell(quals: List[Dict[str, Any]]) -> str:
    names = {"image": "image", "host-python": "python"}
    return ",".join(dict.fromkeys(names.get(str(q["where"]), "?") for q in quals)) or "-"


def render_table(report: Dict[str, Any]) -> str:
    """HOST ENGINE IMAGE VERIFY DEVICE WHERE <gates...> BUSBW VERDICT, then every reason and note
    of a row whole (never cut), the problems, the bundles named and the fleet's verdict."""
    gates = [g for g in GATES if any(g in h["gates"] for h in report["hosts"])]
    short = {"optimizer": "optim", "allreduce": "allred", "shutdown": "shutdn", "restart": "restrt"}
    rows = [("HOST", "ENGINE", "IMAGE", "VERIFY", "DEVICE", "WHERE", *[short.get(g, g) for g in gates], "BUSBW",
             "VERDICT")]
    for h in report["hosts"]:
        images = [i["manifestDigest"] for i in h["images"] if i["manifestDigest"]]
        image = (images[0][:19] + (f" +{len(images) - 1}" if len(images) > 1 else "")) if images else "-"
        verify = "-" if h["verification"] is None else "ok" if h["verification"] else "FAIL"
        engine = (h["engine"] or {}).get("kind") or "-"
        busbw = f"{h['busbwGBps']:.2f}GB/s" if h["busbwGBps"] is not None else "-"
        quals = h["qualifications"]
        rows.append(tuple(printable(str(c)) for c in (  # every cell quotes a receipt: escaped (docs/security.md)
            h["hostname"], engine, image, verify, _device_cell(quals), _where_cell(quals),
            *[h["gates"].get(g, "-") for g in gates], busbw, str(h["verdict"]).upper())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for h in report["hosts"]:
        lines += [f"{h['row']}: {reason}" for reason in h["reasons"] if h["verdict"] != "pass"]
        lines += [f"{h['row']}: note: {note}" for note in h["notes"]]
    lines += [f"problem [{p['id']}] {p['path']}: {p['message']}" for p in report["problems"]]
    for b in report["bundles"]:
        lines.append(f"bundle {b['digest']}" + (f" (created {b['created']}, {b['path']})" if b["path"] else "")
                     + ": every host must hold receipts naming it" + (", not older than it" if b["path"] else ""))
    if not report["bundles"]:
        lines.append("bundle: none named (the digest most hosts show is the fleet's; --bundle BUNDLE or "
                     "--expect-digest checks that the fleet holds the one you mean)")
    c = report["counts"]
    lines.append(f"fleet: {report['verdict']}: {c['passed']}/{c['hosts']} host(s) passed"
                 + (f", {c['stale']} stale" if c["stale"] else "")
                 + (f", {c['missing']} missing" if c["missing"] else "")
                 + (f", {c['problems']} problem(s)" if c["problems"] else "")
                 + f" ({c['receipts']} receipt(s))")
    return "\n".join(printable(line) for line in lines)
