"""What a task's Dockerfile may ask of the image builder: nothing that reaches outside the image.

Rule (issue #51, class 1; docs/sandbox.md "Builds"): the builder (buildah, as root on the host)
executes every instruction, so an instruction is accepted only in a form whose effects stay in
the image being built. This host's buildah 1.28 (Debian) is vulnerable to CVE-2024-1753: a
``RUN --mount=type=bind,from=<stage>`` over a symlink planted in an earlier stage mounts the
host's root read-write into the build. Closed by construction, for every variant at once:

- ``RUN`` takes only the flags known to stay inside: ``--network=none|default`` and
  ``--mount=type=tmpfs`` (no ``from``/``source``); every other flag (any bind, cache, secret
  or ssh mount, ``--network=host``, ``--security=insecure``, one this list does not know) is
  refused, naming the line; ``ONBUILD`` instructions are judged as the instruction they hold;
- ``ADD`` of a URL or a git repository is refused: the builder fetches it from the *host's*
  network namespace, where the host's loopback services answer;
- a parser directive that changes how lines are read (``# escape=``) is refused, so t1ops
  reads the instructions exactly as the builder does; an unknown instruction is refused.

``tasks check``, ``tasks import`` and task loading refuse such a Dockerfile with every
refused line; :func:`rl.agent.container.images.build` checks again before it calls the builder.
"""
from __future__ import annotations

import re
import shlex

from rl.agent.dockerfile import Line, parse

KEYWORDS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
            "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z]+)\s*=\s*(.*)$")
_REMOTE = re.compile(r"^([a-z][a-z0-9+.-]*://|git@)", re.I)
_RUN_NETWORKS = {"none", "default"}


def _flags(args: str) -> tuple[list[str], list[str]]:
    """(the ``--flag`` tokens an instruction starts with, the rest)."""
    try:
        tokens = shlex.split(args)
    except ValueError:
        tokens = args.split()
    n = 0
    while n < len(tokens) and tokens[n].startswith("--"):
        n += 1
    return tokens[:n], tokens[n:]


def _run_flag_problem(flag: str) -> str | None:
    name, _, value = flag.partition("=")
    if name == "--network":
        return None if value in _RUN_NETWORKS else f"RUN --network={value} reaches outside the build"
    if name == "--mount":
        opts = dict(o.partition("=")[::2] for o in value.split(","))
        kind = opts.get("type", "bind")   # buildah's default mount type is bind
        if kind == "tmpfs" and not ({"from", "source", "src"} & opts.keys()):
            return None
        return (f"RUN --mount type={kind} lets the build mount what lies outside the image "
                "(CVE-2024-1753 on this host's buildah); only type=tmpfs is accepted")
    return f"RUN flag {name} is not one a build may use (privileged or unknown)"


def _line_problems(line: Line) -> list[str]:
    kw, args = line.keyword, line.args
    if kw == "ONBUILD":
        inner, _, rest = args.partition(" ")
        return _line_problems(Line(line.number, inner.upper(), rest.strip()))
    if kw not in KEYWORDS:
        return [f"unknown instruction {kw[:40]!r}"]
    flags, rest = _flags(args)
    if kw == "RUN":
        return [p for p in map(_run_flag_problem, flags) if p]
    if kw == "ADD" and any(_REMOTE.match(t) for t in rest[:-1]):
        return ["ADD of a URL is fetched from the host's network namespace; download it in a RUN step"]
    return []


def build_refusals(text: str) -> list[str]:
    """Every instruction of a Dockerfile a build may not run, as ``line N: ... (why)``."""
    out: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        m = _DIRECTIVE.match(raw.strip())
        if not m:
            break   # parser directives come first, before any other line
        if m.group(1).lower() == "escape":
            out.append(f"line {n}: # escape= (a changed escape character reads lines differently from t1ops)")
    for line in parse(text):
        out += [f"{line} ({why})" for why in _line_problems(line)]
    return out
