from pathlib import Path

def test_exists():
    assert Path("seq.txt").is_file()

def test_five_lines():
    assert len(Path("seq.txt").read_text().splitlines()) == 5

def test_first_last():
    lines = Path("seq.txt").read_text().splitlines()
    assert lines[:1] == ["1"] and lines[-1:] == ["5"]

def test_exact():
    assert Path("seq.txt").read_text() == "1\n2\n3\n4\n5\n"
