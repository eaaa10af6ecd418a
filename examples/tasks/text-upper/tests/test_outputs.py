from pathlib import Path

def test_exists():
    assert Path("out.txt").is_file()

def test_line_count():
    assert len(Path("out.txt").read_text().splitlines()) == 2

def test_is_upper():
    text = Path("out.txt").read_text()
    assert text.strip() and text == text.upper()

def test_exact():
    assert Path("out.txt").read_text() == "HELLO WORLD\nSMALL TASKS\n"
