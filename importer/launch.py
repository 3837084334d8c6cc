"""The entry point of ``bundle-import.pyz`` and ``python -m importer``, written to parse and run on
any python3 from 3.6 on (no annotations: the types are in comments, which mypy reads), so that an
older interpreter gets a sentence instead of a traceback.

The importer needs Python 3.8. On an older python3 (RHEL/Rocky 8 and Ubuntu 18.04 ship 3.6,
Debian 10 ships 3.7: common on older air-gapped GPU hosts) this looks for a newer interpreter on
PATH, newest first (``python3.14`` ... ``python3.8``), asks each for its version (a pyenv shim or
a broken link answers nothing) and re-executes the same command line with the first that is 3.8
or newer, saying so on stderr. RHEL's ``/usr/libexec/platform-python`` is not on PATH and is
3.6: it is never used. With none found: one sentence (what it needs, what it found, how to get
it on RHEL 8 and Ubuntu 18.04), exit 2."""

import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple  # noqa: F401 (named in the type comments)

NEEDED = (3, 8)
NEWEST_MINOR = 14
#: set in the environment of the re-executed importer: a newer python3 that still came up old
#: (a wrapper script) is reported, never re-executed again
REEXEC_ENV = "SNEAKERNET_IMPORTER_REEXEC"
EXIT_USAGE = 2


def _version_of(path):
    # type: (str) -> Optional[Tuple[int, int]]
    """(major, minor) of the interpreter at ``path``, or None when it does not answer."""
    try:
        out = subprocess.run([path, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    text = out.stdout.decode("ascii", "replace").strip()
    parts = text.split(".")
    if out.returncode != 0 or len(parts) != 2 or not all(p and all(c in "0123456789" for c in p) for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def find_newer_python(path_env=None):
    # type: (Optional[str]) -> Optional[Tuple[str, Tuple[int, int]]]
    """(path, (major, minor)) of the newest python3.N on PATH with N >= 8, or None."""
    folders = [d for d in (path_env if path_env is not None else os.environ.get("PATH", "")).split(os.pathsep) if d]
    for minor in range(NEWEST_MINOR, NEEDED[1] - 1, -1):
        name = f"python3.{minor}"
        for folder in folders:
            path = os.path.join(folder, name)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                continue
            found = _version_of(path)
            if found is not None and found >= NEEDED:
                return path, found
    return None


def _say(line):
    # type: (str) -> None
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _too_old(here):
    # type: (str) -> str
    return ("bundle-import: expected Python {}.{} or newer, found Python {} ({}) and no python3.8 ... python3.{} "
            "on PATH; install one and run the same command with it: RHEL/Rocky 8: `dnf install python39`, then "
            "`python3.9 BUNDLE/bundle-import.pyz BUNDLE ...`; Ubuntu 18.04: `apt install python3.8`, then "
            "`python3.8 BUNDLE/bundle-import.pyz BUNDLE ...` (/usr/libexec/platform-python is 3.6: it will not do)"
            ).format(NEEDED[0], NEEDED[1], here, sys.executable or "python3", NEWEST_MINOR)


def run():
    # type: () -> int
    """Run the importer here when this python3 is new enough, else re-execute with one that is."""
    if sys.version_info[:2] >= NEEDED:
        from importer.cli.main import main
        return main()
    here = "{}.{}.{}".format(*sys.version_info[:3])
    if os.environ.get(REEXEC_ENV):
        _say(_too_old(here))
        return EXIT_USAGE
    found = find_newer_python()
    if found is None:
        _say(_too_old(here))
        return EXIT_USAGE
    path, version = found
    _say(f"bundle-import: this python3 is {here}, older than the {NEEDED[0]}.{NEEDED[1]} the importer needs; "
         f"running it with {path} ({version[0]}.{version[1]})")
    flags = ["-I"] if sys.flags.isolated else []  # type: List[str]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", "") == "importer.__main__":  # python3 -m importer
        argv = [path, *flags, "-m", "importer", *sys.argv[1:]]
    else:  # python3 BUNDLE/bundle-import.pyz: argv[0] is the zipapp
        argv = [path, *flags, *sys.argv]
    env = dict(os.environ)  # type: Dict[str, str]
    env[REEXEC_ENV] = "1"
    try:
        os.execve(path, argv, env)  # noqa: S606 (the interpreter found above, the user's own arguments)
    except OSError as e:
        _say(f"bundle-import: expected to run {path}, found {e}; run the same command with it by hand")
    return EXIT_USAGE
