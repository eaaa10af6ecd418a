from pathlib import Path

def test_a():
    assert Path("a.txt").is_file()

def test_b():
    assert Path("b.txt").is_file()

def test_c():
    assert Path("c.txt").is_file()

def test_all_empty():
    assert all(Path(n).is_file() and Path(n).stat().st_size == 0 for n in ("a.txt", "b.txt", "c.txt"))
