from pathlib import Path

OUT = Path('summary.txt')

def test_exists():
    assert OUT.is_file()

def test_single_line():
    assert len(OUT.read_text().splitlines()) == 1

def test_form():
    assert OUT.read_text().strip().isdigit()

def test_value():
    assert OUT.read_text().strip() == '313'
