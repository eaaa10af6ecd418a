from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_two_lines():
    assert len(Path("out.txt").read_text().splitlines()) == 2

def test_last_line():
    assert Path("out.txt").read_text().splitlines()[-1:] == ["six"]

def test_exact():
    assert Path("out.txt").read_text() == "five\nsix\n"
