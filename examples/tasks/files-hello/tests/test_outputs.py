from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_not_empty():
    assert Path("out.txt").read_text().strip()

def test_starts_with_hello():
    assert Path("out.txt").read_text().startswith("hello")

def test_exact():
    assert Path("out.txt").read_text() == "hello\n"
