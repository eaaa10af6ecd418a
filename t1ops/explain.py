"""`t1ops explain ID`: one hop from a failure id to its guard, scenario, runbook and config keys.

The catalogue is the table of docs/failures.md. Guards declare in code the ids they catch:
a module-level ``CATCHES = {"<id>": ("<config key>", ...)}`` in the guard's module (read here
with ``ast``, without importing the module). ``tests/t1ops/test_explain.py`` fails when a
catalogue id has no declaring guard, a guard declares an id outside the catalogue, the table's
guard column names another module, or a declared config key does not exist.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from t1ops.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CATALOGUE = REPO / "docs" / "failures.md"
SOURCE_ROOTS = ("t1ops", "rl")
_ROW = re.compile(r"^\| ([a-z0-9-]+) \| (.+?) \| (.+) \| `([^`]+)` \|$")


@dataclass
class Entry:
    id: str
    failure: str
    guardrail: str
    guard_module: str                                  # the table's last column
    declared_by: list[str] = field(default_factory=list)  # modules whose CATCHES names the id
    config_keys: list[str] = field(default_factory=list)


def catalogue(path: Path = CATALOGUE) -> dict[str, Entry]:
    """The failure table of docs/failures.md, by id."""
    out = {}
    for line in path.read_text().splitlines():
        m = _ROW.match(line.strip())
        if m and m.group(1) != "id":
            out[m.group(1)] = Entry(m.group(1), m.group(2), m.group(3), m.group(4))
    return out


def declarations(root: Path = REPO) -> dict[str, dict[str, tuple[str, ...]]]:
    """Every module's ``CATCHES`` (repo-relative path -> {id: config keys})."""
    out = {}
    for top in SOURCE_ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            text = path.read_text()
            if "CATCHES" not in text:
                continue
            for node in ast.parse(text).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CATCHES"
                                                        for t in node.targets):
                    out[str(path.relative_to(root))] = {k: tuple(v) for k, v in ast.literal_eval(node.value).items()}
    return out


def entries() -> dict[str, Entry]:
    """The catalogue with each id's declaring guards and governing config keys filled in."""
    cat = catalogue()
    for module, catches in declarations().items():
        for fid, keys in catches.items():
            if fid in cat:
                cat[fid].declared_by.append(module)
                cat[fid].config_keys += [k for k in keys if k not in cat[fid].config_keys]
    return cat


def explain(item: str) -> str:
    """The text `t1ops explain` prints for a failure id (or a config key: the ids it governs)."""
    cat = entries()
    if item in cat:
        return _explain_id(cat[item])
    if item.startswith("health."):
        return _explain_alarm(item)
    governs = sorted(e.id for e in cat.values() if item in e.config_keys)
    fields = _config_fields()
    if item in fields:
        default, desc = fields[item]
        text = f"{item} (default {default}): {desc}"
        return text + ("\n  governs: " + ", ".join(governs) if governs else "\n  governs no catalogued failure")
    close = [i for i in cat if item in i or i in item][:5]
    raise ConfigError(f"'{item}' is neither a failure id of docs/failures.md nor a config key"
                      + (f"; did you mean {close}?" if close else f"; ids: {', '.join(sorted(cat))}"), key=item)


def _explain_id(e: Entry) -> str:
    runbook = REPO / "runbooks" / f"{e.id}.md"
    symptom = runbook.read_text().split("\n", 1)[0].lstrip("# ") if runbook.is_file() else "(no runbook)"
    fields = _config_fields()
    lines = [f"{e.id}: {e.failure}",
             f"  guardrail: {e.guardrail}",
             "  guard:     " + (", ".join(e.declared_by) or f"NONE declares it (docs/failures.md says {e.guard_module})"),
             f"  scenario:  t1ops chaos run {e.id}   (chaos/scenarios/{e.id.replace('-', '_')}.py)",
             f"  runbook:   runbooks/{e.id}.md   ({symptom})"]
    if e.config_keys:
        lines.append("  config:")
        lines += [f"    {k} = {fields[k][0] if k in fields else '?'}   {fields[k][1] if k in fields else ''}"
                  for k in e.config_keys]
    else:
        lines.append("  config:    none (always on)")
    return "\n".join(lines)


def _explain_alarm(item: str) -> str:
    """A run-health alarm (t1ops/guards/run_health.py): what it means, its threshold, what to do."""
    from t1ops.guards.run_health import ALARMS, THRESHOLDS

    if item not in ALARMS:
        raise ConfigError(f"'{item}' is not a run-health alarm; alarms: {', '.join(sorted(ALARMS))}", key=item)
    meaning, todo = ALARMS[item]
    fields = _config_fields()
    lines = [f"{item}: {meaning}", "  alarm:     a warning event on the step line ('ALARM ...') and in the row's "
                                   f"health map (TensorBoard: train/health/{item.split('.', 1)[1]})",
             "  guard:     t1ops/guards/run_health.py", "  config:"]
    lines += [f"    {k} = {fields[k][0] if k in fields else '?'}   {fields[k][1] if k in fields else ''}"
              for k in THRESHOLDS[item]]
    return "\n".join(lines + [f"  what to do: {todo}"])


def _config_fields() -> dict[str, tuple[str, str]]:
    from t1ops.config import describe

    return {key: (default, desc) for key, default, desc in describe()}


def consistency_errors(cat: dict[str, Entry] | None = None,
                       decls: dict[str, dict[str, tuple[str, ...]]] | None = None) -> list[str]:
    """Everything that breaks the one-hop promise: an id no guard declares, a declared id outside
    the catalogue, a table row naming another module than the declaring one, an unknown config key."""
    cat = catalogue() if cat is None else cat
    decls = declarations() if decls is None else decls
    keys = set(_config_fields())
    errors = []
    declared: dict[str, list[str]] = {}
    for module, catches in decls.items():
        for fid, config_keys in catches.items():
            declared.setdefault(fid, []).append(module)
            if fid not in cat:
                errors.append(f"{module} declares '{fid}', which is not in docs/failures.md")
            errors += [f"{module}: '{fid}' names config key '{k}', which does not exist" for k in config_keys
                       if k not in keys]
    for fid, e in cat.items():
        if fid not in declared:
            errors.append(f"'{fid}' has no guard that declares it (add it to CATCHES in {e.guard_module})")
        elif e.guard_module not in declared[fid]:
            errors.append(f"'{fid}': docs/failures.md names {e.guard_module}, declared by {declared[fid]}")
    return errors
