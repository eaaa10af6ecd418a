from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_three_lines():
    assert len(Path("out.txt").read_text().splitlines()) == 3

def test_first_line():
    assert Path("out.txt").read_text().splitlines()[:1] == ["one"]

def test_exact():
    assert Path("out.txt").read_text() == "one\ntwo\nthree\n"
