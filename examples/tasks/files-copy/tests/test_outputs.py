from pathlib import Path

def test_exists():
    assert Path("backup.txt").is_file()

def test_same_line_count():
    assert len(Path("backup.txt").read_text().splitlines()) == 3

def test_identical():
    assert Path("backup.txt").read_text() == Path("data.txt").read_text()

def test_original_kept():
    assert Path("data.txt").read_text() == "alpha\nbeta\ngamma\n"
