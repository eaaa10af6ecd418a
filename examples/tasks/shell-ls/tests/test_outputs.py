from pathlib import Path

def test_exists():
    assert Path("files.txt").is_file()

def test_has_a():
    assert "a.txt" in Path("files.txt").read_text().split()

def test_has_b():
    assert "b.txt" in Path("files.txt").read_text().split()

def test_has_c():
    assert "c.txt" in Path("files.txt").read_text().split()
