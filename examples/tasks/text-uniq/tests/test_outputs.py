from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_no_duplicates():
    lines = Path("out.txt").read_text().splitlines()
    assert lines and len(lines) == len(set(lines))

def test_same_set():
    assert set(Path("out.txt").read_text().split()) == {"a", "b", "c"}

def test_exact():
    assert Path("out.txt").read_text() == "a\nb\nc\n"
