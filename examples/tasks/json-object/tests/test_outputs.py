from pathlib import Path

import json

def test_exists():
    assert Path("config.json").is_file()

def test_valid_json():
    json.loads(Path("config.json").read_text())

def test_has_name():
    assert "name" in json.loads(Path("config.json").read_text())

def test_value():
    assert json.loads(Path("config.json").read_text()) == {"name": "t1"}
