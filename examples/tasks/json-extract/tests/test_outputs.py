from pathlib import Path

def test_exists():
    assert Path("version.txt").is_file()

def test_no_quotes():
    text = Path("version.txt").read_text()
    assert text.strip() and '"' not in text

def test_value():
    assert Path("version.txt").read_text().strip() == "1.4.2"

def test_single_line():
    assert Path("version.txt").read_text() == "1.4.2\n"
