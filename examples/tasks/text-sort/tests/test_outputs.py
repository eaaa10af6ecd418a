from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_same_lines():
    assert sorted(Path("out.txt").read_text().split()) == sorted(Path("in.txt").read_text().split())

def test_first_line():
    assert Path("out.txt").read_text().splitlines()[:1] == ["apple"]

def test_sorted():
    lines = Path("out.txt").read_text().splitlines()
    assert lines and lines == sorted(lines)
