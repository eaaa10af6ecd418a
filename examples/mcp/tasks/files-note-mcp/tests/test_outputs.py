import json
from pathlib import Path


def test_notes_written():
    assert Path("notes.txt").read_text() == "ready\n"


def test_written_through_the_mcp_tool():
    calls = [json.loads(line) for line in Path(".mcp_calls.jsonl").read_text().splitlines() if line.strip()]
    assert {"tool": "write_file", "path": "notes.txt"} in calls
