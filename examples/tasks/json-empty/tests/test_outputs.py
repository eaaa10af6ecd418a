from pathlib import Path

import json

def test_exists():
    assert Path("empty.json").is_file()

def test_valid_json():
    json.loads(Path("empty.json").read_text())

def test_is_object():
    assert isinstance(json.loads(Path("empty.json").read_text()), dict)

def test_empty():
    assert json.loads(Path("empty.json").read_text()) == {}
