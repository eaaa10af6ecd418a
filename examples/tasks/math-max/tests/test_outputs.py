from pathlib import Path

def test_exists():
    assert Path("max.txt").is_file()

def test_single_line():
    assert len(Path("max.txt").read_text().splitlines()) == 1

def test_is_integer():
    assert Path("max.txt").read_text().strip().isdigit()

def test_value():
    assert int(Path("max.txt").read_text().strip()) == 21
