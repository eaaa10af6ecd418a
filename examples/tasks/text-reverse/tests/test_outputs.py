from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_same_lines():
    assert sorted(Path("out.txt").read_text().split()) == ["1", "2", "3", "4"]

def test_first_line():
    assert Path("out.txt").read_text().splitlines()[:1] == ["4"]

def test_exact():
    assert Path("out.txt").read_text() == "4\n3\n2\n1\n"
