"""What of a task's ``environment/Dockerfile`` can be honoured on this host, line by line.

The local backend (rl/agent/environment.py) builds no image. It honours:

- ``FROM`` (one stage): noted; the host's userland stands in for the base image;
- ``WORKDIR``: where the workspace appears (``/app`` in most Harbor tasks);
- ``COPY`` / ``ADD`` of files from ``environment/`` into the workspace (``WORKDIR``);
- ``ENV`` and ``ARG`` (``$VAR`` / ``${VAR}`` substituted in later lines);
- ``RUN mkdir [-p] DIR...`` inside the workspace, and ``RUN`` installs whose packages are
  all already present on this host (``apt-get install`` / ``apt install`` checked with
  dpkg, ``pip install`` checked against this interpreter's distributions), with
  ``apt-get update`` and apt-list cleanup as no-ops; ``&&``-chains of those;
- ``USER``, ``LABEL``, ``EXPOSE``, ``CMD``, ``ENTRYPOINT``, ``MAINTAINER``, ``STOPSIGNAL``:
  noted, no effect (commands always run as an unprivileged uid here).

Everything else is refused with its line number and the reason; such a task "needs a
container runtime" (docs/tasks.md).
"""
from __future__ import annotations

import functools
import json
import posixpath
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

_NOTED = {"USER", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "STOPSIGNAL"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
# what $PATH means in an ENV line before any ENV set it: Docker's default for Linux images
IMAGE_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHELL_NOOPS = {"set", "true", ":"}
_APT_NOOPS = (("apt-get", "update"), ("apt", "update"), ("apt-get", "clean"), ("apt", "clean"))


@dataclass(frozen=True)
class Line:
    """One Dockerfile instruction (continuations joined), with its first line number."""

    number: int
    keyword: str
    args: str

    def __str__(self) -> str:
        return f"line {self.number}: {self.keyword} {self.args}"[:160]


@dataclass
class Plan:
    """The local backend's reading of a Dockerfile: what to do, and what it cannot do."""

    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)   # (src under environment/, dest)
    mkdirs: list[str] = field(default_factory=list)               # absolute paths
    notes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)             # "line N: ... (why)"

    @property
    def runs_locally(self) -> bool:
        return not self.refusals


def parse(text: str) -> list[Line]:
    """Instructions with backslash continuations joined and comments dropped."""
    lines: list[Line] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        lines.append(Line(start, keyword.upper(), args.strip()))
        buf = ""
    if buf:
        keyword, _, args = buf.partition(" ")
        lines.append(Line(start, keyword.upper(), args.strip()))
    return lines


def _subst(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(3), m.group(2) or ""), text)


def _kv_pairs(args: str) -> dict[str, str]:
    """ENV/ARG arguments: ``K=V K2="v 2"`` or the legacy ``K value with spaces``."""
    try:
        parts = shlex.split(args)
    except ValueError:
        parts = args.split()
    if parts and "=" not in parts[0]:
        return {parts[0]: " ".join(parts[1:])}
    return dict(p.split("=", 1) if "=" in p else (p, "") for p in parts)


def image_settings(text: str) -> tuple[str | None, dict[str, str]]:
    """(WORKDIR, ENV) of a Dockerfile, without judging its other lines (cheap: task load)."""
    workdir, env, scope = None, {}, {"PATH": IMAGE_DEFAULT_PATH}
    for line in parse(text):
        args = _subst(line.args, scope)
        if line.keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", args))
        elif line.keyword in ("ENV", "ARG"):
            pairs = _kv_pairs(args)
            scope.update(pairs)
            if line.keyword == "ENV":
                env.update(pairs)
    return workdir, env


def plan(text: str, context: Path) -> Plan:
    """Read a Dockerfile whose build context is ``context`` (the task's environment/)."""
    out = Plan()
    scope: dict[str, str] = {"PATH": IMAGE_DEFAULT_PATH}
    froms = 0
    for line in parse(text):
        args = _subst(line.args, scope)
        kw = line.keyword
        if kw == "FROM":
            froms += 1
            if froms > 1 or " AS " in f" {args.upper()} ":
                out.refusals.append(f"{line} (multi-stage builds need a container runtime)")
            else:
                out.notes.append(f"{line} (the host's userland stands in for the base image)")
        elif kw == "WORKDIR":
            out.workdir = posixpath.normpath(posixpath.join(out.workdir or "/", args))
        elif kw in ("ENV", "ARG"):
            pairs = _kv_pairs(args)
            scope.update(pairs)
            if kw == "ENV":
                out.env.update(pairs)
        elif kw in ("COPY", "ADD"):
            _copy(line, args, context, out)
        elif kw == "RUN":
            _run(line, args, out)
        elif kw in _NOTED:
            out.notes.append(f"{line} (no effect locally)")
        else:
            out.refusals.append(f"{line} ({kw} is not supported by the local backend)")
    return out


def _copy(line: Line, args: str, context: Path, out: Plan) -> None:
    try:
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
    except ValueError as e:
        out.refusals.append(f"{line} (cannot parse the arguments: {e})")
        return
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        out.refusals.append(f"{line} (the JSON form must be a list of strings)")
        return
    flags = [p for p in parts if p.startswith("--")]
    paths = [p for p in parts if not p.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        out.refusals.append(f"{line} (copying from another image or stage needs a container runtime)")
        return
    if len(paths) < 2:
        out.refusals.append(f"{line} (needs a source and a destination)")
        return
    *srcs, dest = paths
    workdir = out.workdir or "/app"
    dest_abs = posixpath.normpath(posixpath.join(workdir, dest))
    if not (dest_abs == workdir or dest_abs.startswith(workdir.rstrip("/") + "/")):
        out.refusals.append(f"{line} (destination {dest_abs} is outside the workspace {workdir}; "
                            "only the workspace is populated locally)")
        return
    root = context.resolve()
    for src in srcs:
        if "://" in src:
            out.refusals.append(f"{line} (fetching {src} needs the network at build time)")
            return
        resolved = (root / src).resolve()
        if not resolved.is_relative_to(root) or not resolved.exists():
            out.refusals.append(f"{line} ({src} is not a file inside environment/)")
            return
        if line.keyword == "ADD" and resolved.is_file() and re.search(r"\.(tar|tgz|gz|bz2|xz)$", src):
            out.refusals.append(f"{line} (ADD would unpack the archive {src}; use COPY of the files)")
            return
    rel_dest = posixpath.relpath(dest_abs, workdir)
    for src in srcs:   # a directory's contents go into dest; files into dest/ when it is a dir
        into_dir = (root / src).is_dir() or not (len(srcs) == 1 and not dest.endswith("/"))
        name = posixpath.basename(src.rstrip("/"))
        out.copies.append((src, rel_dest if (root / src).is_dir() or not into_dir
                           else posixpath.normpath(posixpath.join(rel_dest, name))))


def _run(line: Line, args: str, out: Plan) -> None:
    if args.startswith("["):
        out.refusals.append(f"{line} (exec-form RUN needs a container runtime)")
        return
    for cmd in (c.strip() for c in re.split(r"&&|;", args) if c.strip()):
        why = _run_one(cmd, out)
        if why:
            out.refusals.append(f"{line} ({why})")
            return


def _run_one(cmd: str, out: Plan) -> str | None:
    """None if ``cmd`` is honoured (or a no-op here), else why not."""
    if re.search(r"[|<>`]|\$\(", cmd):
        return f"'{cmd[:60]}' is a shell pipeline or redirection; it needs a container runtime"
    try:
        words = shlex.split(cmd)
    except ValueError as e:
        return f"cannot parse '{cmd[:60]}' ({e})"
    words = [w for w in words if w not in ("sudo",)]
    if not words or words[0] in _SHELL_NOOPS:
        return None
    if tuple(words[:2]) in _APT_NOOPS or words[:2] == ["rm", "-rf"] and all(
            w.startswith("/var/lib/apt/lists") or w.startswith("/var/cache/apt") for w in words[2:]):
        return None
    if words[0] == "mkdir":
        dirs = [w for w in words[1:] if not w.startswith("-")]
        workdir = out.workdir or "/app"
        for d in dirs:
            abs_d = posixpath.normpath(posixpath.join(workdir, d))
            if not (abs_d == workdir or abs_d.startswith(workdir.rstrip("/") + "/")):
                return f"mkdir {abs_d} is outside the workspace {workdir}"
            out.mkdirs.append(abs_d)
        return None
    if words[0] in ("apt-get", "apt") and "install" in words:
        pkgs = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        missing = [p for p in pkgs if not _dpkg_has(p)]
        return f"apt packages not installed on this host: {', '.join(missing)}" if missing else None
    pip = _pip_args(words)
    if pip is not None:
        missing = [p for p in pip if not _dist_has(p)]
        return f"Python packages not present here: {', '.join(missing)}" if missing else None
    return f"'{cmd[:60]}' is an arbitrary build command; it needs a container runtime"


def _pip_args(words: list[str]) -> list[str] | None:
    """The requirement strings of a ``pip install`` / ``python -m pip install`` / ``uv pip
    install`` command, or None if it is not one (or installs from files/URLs)."""
    for i in range(len(words) - 1):
        if words[i] in ("pip", "pip3") and words[i + 1] == "install":
            reqs = [w for w in words[i + 2:] if not w.startswith("-")]
            if any(w in ("-r", "--requirement", "-e", "--editable") for w in words[i + 2:]):
                return ["(a requirements file or an editable install)"]
            return reqs
    return None


@functools.lru_cache(maxsize=256)
def _dpkg_has(spec: str) -> bool:
    name, _, version = spec.partition("=")
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", name],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    status, _, have = res.stdout.partition("\t")
    return res.returncode == 0 and status.endswith("installed") and (not version or
                                                                      have.startswith(version))


@functools.lru_cache(maxsize=256)
def _dist_has(spec: str) -> bool:
    m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==\s*([^,;\s]+))?", spec)
    if not m or (spec[m.end():].strip() and not m.group(2)):
        return False      # a range or marker: not checked, so not honoured
    try:
        have = importlib_metadata.version(m.group(1))
    except importlib_metadata.PackageNotFoundError:
        return False
    return m.group(3) is None or have == m.group(3)
