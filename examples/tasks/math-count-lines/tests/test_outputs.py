from pathlib import Path

def test_exists():
    assert Path("count.txt").is_file()

def test_single_line():
    assert len(Path("count.txt").read_text().splitlines()) == 1

def test_is_integer():
    assert Path("count.txt").read_text().strip().isdigit()

def test_value():
    assert int(Path("count.txt").read_text().strip()) == 5
