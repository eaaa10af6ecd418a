from pathlib import Path

def test_exists():
    assert Path("errors.txt").is_file()

def test_all_match():
    lines = Path("errors.txt").read_text().splitlines()
    assert lines and all("error" in l for l in lines)

def test_count():
    assert len(Path("errors.txt").read_text().splitlines()) == 2

def test_exact():
    assert Path("errors.txt").read_text() == "error: disk full\nerror: retry\n"
