from pathlib import Path

import json

def test_exists():
    assert Path("list.json").is_file()

def test_is_list():
    assert isinstance(json.loads(Path("list.json").read_text()), list)

def test_length():
    assert len(json.loads(Path("list.json").read_text())) == 3

def test_value():
    assert json.loads(Path("list.json").read_text()) == [1, 2, 3]
